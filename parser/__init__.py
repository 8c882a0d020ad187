"""File formats, with no runtime knowledge: pnnx param text, pnnx bin (zip store), expressions."""
