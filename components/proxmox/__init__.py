"""proxmox"""
