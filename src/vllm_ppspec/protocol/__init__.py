"""The pure protocol: round matrices and their channel, the lane book, accepted
counts, the DP agreement, fault switches. No module here imports vLLM."""
