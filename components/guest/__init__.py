"""guest"""
