"""spyre_lab.engine.models"""
