"""spyre_lab.runtime"""
