"""
The project's own build tools (tools/image.py: amp's container image), a
package so that the tests import them as ``tools.image`` rather than by
file path.  Not part of amp.
"""
