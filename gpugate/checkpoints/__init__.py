"""Which checkpoint is complete: discover.py (the API), layouts.py, torchfile.py, listing.py."""
