"""spyre_lab.compiler"""
