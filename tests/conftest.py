import os
import sys

# the tests import their helpers (factory.py) by name
sys.path.insert(0, os.path.dirname(__file__))
