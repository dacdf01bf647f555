"""Checkpoint and resume: state_dict()/load_state_dict() of map-style and iterable loaders, the
state's parts, ranks and frameworks, refused states, and deaths around a checkpoint. Their
datasets stay in tests/resume_datasets.py, importable by that name in workers."""
