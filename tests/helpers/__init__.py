"""Modules the tests use that are not tests: `distributed_update`, the program torchrun launches
for test_ppo_continuous_action_distributed.py."""
