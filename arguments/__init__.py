"""A run's configuration: the dataclasses (`config.py`), the command line generated from them
(`parser.py`), where each value came from (`config_sources.py`), and the translations from Megatron-LM,
Megatron-DeepSpeed and DeepSpeed JSON. It resolves what the user wrote; it runs nothing."""
