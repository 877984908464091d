"""spatialc.runtime"""
