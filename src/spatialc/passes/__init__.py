"""spatialc.passes"""
