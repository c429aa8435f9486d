"""The end of `make main`: run the fixed binary on a tiny generated model with a forced KV window."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from gates.common import ensure_model, own_libraries_env


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.demo", description=__doc__)
    ap.add_argument("--bin", type=Path, required=True, help="directory with llama-completion")
    ap.add_argument("--window", type=int, default=256, help="forced resident window (cells)")
    ap.add_argument("--work", type=Path, default=Path("build/demo"))
    a = ap.parse_args()
    exe = a.bin / "llama-completion"
    if not exe.is_file():
        sys.exit(f"demo: {exe} not found; run `forktool build --profile cpu` first")
    a.work.mkdir(parents=True, exist_ok=True)
    model = ensure_model(a.work / "tiny-llama.gguf", [])
    # a prompt longer than the window, so the host tail holds cells and attention streams it
    prompt = "once upon a time the sky was blue and the grass was green. " * 40
    argv = [str(exe), "-m", str(model), "-p", prompt, "-n", "16", "-c", "2048", "-b", "512", "-ub", "512",
            "-fa", "on", "--kv-residency-mode", "window", "--kv-window-cells", str(a.window),
            "--temp", "0", "--seed", "1", "-t", "2", "-no-cnv", "-lv", "4"]
    r = subprocess.run(argv, capture_output=True, text=True, env=own_libraries_env(argv, dict(os.environ, LLAMA_LOG_COLORS="0")))
    log = r.stdout + r.stderr
    (a.work / "demo.log").write_text(log)
    lines = [ln for ln in log.splitlines() if "position window" in ln]
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                             env=own_libraries_env([str(exe)], dict(os.environ)))
    vtext = (version.stdout + version.stderr).strip().splitlines()
    print("binary:", " ".join(vtext[:2]) if vtext else "?")
    for ln in lines:
        print(ln.strip())
    speed = re.findall(r"eval time .*?([0-9.]+) tokens per second", log)
    if r.returncode != 0 or not lines or "host tail" not in lines[0]:
        print(f"demo: FAILED (exit {r.returncode}); log in {a.work / 'demo.log'}", file=sys.stderr)
        return 1
    print(f"demo: OK, the fixed binary ran with a {a.window}-cell window and a host tail"
          + (f" ({speed[-1]} tokens/s decode)" if speed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
