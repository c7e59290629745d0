"""The ``full`` image profile (runtime.image_profile): the languages OpenAI's hosted shell
lists, in Debian's versions, each compiling or running a program as the sandbox user."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sandbox_helpers import IMAGE_DIR, make_state_dir, remove_state_dir, run1

from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime, create_runtime
from shellbox.settings import Settings

PROGRAMS = {
    "node": "node -e 'console.log(6 * 7)'",
    "npm": "npm --version >/dev/null && echo 42",
    "java": "printf 'class A { public static void main(String[] a) { System.out.println(42); } }'"
    " > A.java && javac A.java && java A",
    "php": "php -r 'echo 6 * 7, PHP_EOL;'",
    "ruby": "ruby -e 'puts 6 * 7'",
    "go": 'mkdir -p g && cd g && printf \'package main\\nimport "fmt"\\n'
    "func main() { fmt.Println(42) }\\n' > m.go && HOME=/tmp go run m.go",
    "c": "printf '#include <stdio.h>\\nint main(void) { printf(\"42\\\\n\"); }\\n' > m.c"
    " && gcc -o m m.c && ./m",
    "python": "python3 -c 'print(6 * 7)'",
}


@pytest.fixture(scope="module")
async def full() -> AsyncIterator[tuple[OciRuntime, str]]:
    state = make_state_dir("shellbox-full-")
    settings = Settings(state_dir=state, runtime={"image_dir": IMAGE_DIR, "image_profile": "full"})
    rt = create_runtime(settings)  # ./scripts/test.sh built the image; else this builds it
    cid = new_id("cntr_")
    await rt.create(ContainerSpec(id=cid))
    await rt.start(cid)
    yield rt, cid
    await rt.destroy(cid)
    remove_state_dir(state)


@pytest.mark.parametrize("language", list(PROGRAMS))
async def test_each_language_runs_a_program(full: tuple[OciRuntime, str], language: str) -> None:
    rt, cid = full
    result = await run1(rt, cid, PROGRAMS[language], timeout_ms=120_000)
    assert (result.stdout, result.outcome.exit_code) == ("42\n", 0), result
