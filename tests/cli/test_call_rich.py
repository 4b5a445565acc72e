"""`toolreg call` of a tool whose result holds an image and a file: `--json` prints the blocks, `--save DIR`
writes the binary ones to files and prints their paths."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from support import atoolreg, toolreg_env
from support.live import REPORT, SWATCH, SwatchService

from toolservice_base import ConfigClient, Settings


async def test_json_prints_the_blocks_and_save_writes_the_binary_ones(
    tmp_path: Path, settings: Settings, config_client: ConfigClient
) -> None:
    async with SwatchService(settings=settings, announce=False) as service:
        await config_client.put(
            [("tool-service", service.id, service.service_descriptor.to_json())]
            + [("tool", t.name, t.to_json()) for t in service.tool_descriptors]
        )
        env = toolreg_env(settings.pulsar_url or "", tmp_path)

        as_json = await atoolreg("call", "swatch", "rgb=9,9,9", "--json", env=env)
        assert as_json.returncode == 0, as_json.stderr
        said = json.loads(as_json.stdout)
        assert said["observation"].startswith("swatch 9,9,9\n[image: image/png, 71 bytes]")
        assert said["content"][0] == {"type": "text", "text": "swatch 9,9,9"}
        assert said["content"][1] == {
            "type": "image",
            "data": base64.b64encode(SWATCH).decode(),
            "mimeType": "image/png",
        }
        assert base64.b64decode(said["content"][2]["resource"]["blob"]) == REPORT

        out = tmp_path / "out"
        saved = await atoolreg("call", "swatch", "rgb=9,9,9", "--save", str(out), env=env)
        assert saved.returncode == 0, saved.stderr
        lines = saved.stdout.splitlines()
        assert lines[0] == "swatch 9,9,9"
        assert lines[1] == f"[image: image/png, 71 bytes] saved to {out / 'swatch-1.png'}"
        assert lines[2].endswith(f"saved to {out / 'swatch-2.pdf'}")
        assert (out / "swatch-1.png").read_bytes() == SWATCH and (out / "swatch-2.pdf").read_bytes() == REPORT

        both = json.loads((await atoolreg("call", "swatch", "rgb=1,1,1", "--json", "--save", str(out), env=env)).stdout)
        assert both["content"][1] == {"type": "image", "mimeType": "image/png", "path": str(out / "swatch-1.png")}
        assert both["content"][2]["path"] == str(out / "swatch-2.pdf") and "blob" not in both["content"][2]["resource"]
