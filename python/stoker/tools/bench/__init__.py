"""``stoker bench``: stoker against torch's DataLoader (and peers) on the same workloads."""
