"""The last mile to the GPU: batches that arrive pinned, and batches copied to the device ahead.

An iterator asks ``last_mile.last_mile()`` for its ``LastMile``; docs/design/gpu.md has the
rules and the parts: ``pinning`` (slots page-locked once), ``device`` (the copies ahead),
``tree`` (walking a batch), ``runtime`` (the one CUDA interface) and ``cuda`` (torch's).

Thread contract: each module's own.
"""
