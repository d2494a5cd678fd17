"""spyre_lab.engine"""
