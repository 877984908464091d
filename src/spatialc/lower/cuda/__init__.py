"""spatialc.lower.cuda"""
