"""spatialc.lower"""
