"""The release's version, written here and nowhere else.

The packaging metadata of all four distributions reads it (setuptools ``attr:``; each
integration's ``_version.py`` is a symlink to this file), and so do ``healthkit.__version__``
and ``healthkit --version``. Keep it a plain string literal: the build reads it without
importing the package.
"""

__version__ = "0.1.0"
