"""In worker processes, imported by the user's dataset: ``stoker.per_worker`` (``per_worker``),
``stoker.SharedList`` (``shared_list``) and ``stoker.get_worker_info`` (``worker_info``).

Each is built in the training process and used in the workers: what it holds crosses once and is
opened, mapped or set in each worker."""
