"""What the families of families/ share: config.json's field kinds and tables (fields.py), the readers' records
(reader.py: FamilyReader, Llama's settings; dense.py: DenseFamily; moe.py), the weight layouts (llama_shaped.py:
the Llama-shaped conversions; dense_weights.py; layout.py: FamilyWeights), and the registry's record (family.py)."""
