"""In the training process: ``stoker.DataLoader`` (``dataloader``), the iterators that run an epoch
(``iterators``), resuming (``resume``), tuning (``autotune``), the last mile to the GPU (``gpu``)
and ``stoker.enable()`` (``integrations``)."""
