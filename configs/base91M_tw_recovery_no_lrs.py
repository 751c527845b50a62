# The name older READMEs use for the recovery config: identical to base91M_tw_recover_no_lrs.py.
import os as _os

exec(open(_os.path.join(_os.path.dirname(__file__), "base91M_tw_recover_no_lrs.py")).read())
