"""The pure core: the inventory model, its changes, the diff, events and routing. No I/O, no clock."""
