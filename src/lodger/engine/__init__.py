"""The engine: the agent loop, the call pipeline and resume as a mode of the same driver."""
