"""(filled in by its stage)"""
