"""spyre_lab.engine.platforms"""
