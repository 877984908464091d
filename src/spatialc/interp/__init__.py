"""spatialc.interp"""
