"""Scripts that run on Proxmox nodes and guests, shipped as package data and read with importlib.resources."""
