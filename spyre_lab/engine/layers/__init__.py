"""spyre_lab.engine.layers"""
