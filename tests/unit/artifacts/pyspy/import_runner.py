import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trains_on_import  # noqa: E402,F401  (a runner that imports the training's module)
