"""The private and undocumented parts of the libraries the engine builds on, one module per
library (``triton_compat``, ``nbclient_compat``, ``nbconvert_compat``, ``nbgrader_compat``).

Each module names the versions it was written against; requirements.txt pins them.  When a
library moves, its module is the one file to read and change: nothing else of the engine
touches an underscore name or an internal module of these libraries.
"""
