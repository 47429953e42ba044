"""The GPT model (`model.py`) and its configuration beside it (`model_config.py`); it imports torch and
parallel/ only."""
