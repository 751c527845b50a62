"""errors.cli_main's exit: a program's own main leaves its objects frozen (gc.freeze) for a fast
interpreter exit; an in-process caller's objects stay collectable."""
import gc
import subprocess
import textwrap

from conftest import PYTHON, REPO

from tinylab.core.errors import cli_main


def test_a_program_exits_with_its_objects_frozen(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(f"""
        import atexit, gc, sys
        sys.path.insert(0, {REPO!r})
        from tinylab.core.errors import cli_main
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
        def main():
            print("frozen in main:", gc.get_freeze_count() > 0)
        if __name__ == "__main__":
            cli_main(main)
    """))
    out = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["frozen in main: False", "frozen at exit: True"], out


def test_an_in_process_call_freezes_nothing():
    before = gc.get_freeze_count()
    assert cli_main(lambda: 7) == 7
    assert gc.get_freeze_count() == before
