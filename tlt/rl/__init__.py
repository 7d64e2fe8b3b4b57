"""RL: reward verifiers, GRPO advantages and loss, policy update."""
