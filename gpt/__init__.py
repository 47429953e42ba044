"""The GPT model and the training program."""
