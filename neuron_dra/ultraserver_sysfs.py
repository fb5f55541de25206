"""This node's place in a Trainium UltraServer, from the Neuron driver's class attributes
(``/sys/class/neuron_device/{server_id_2,node_id_2,server_id_4,node_id_4,ultraserver_mode}``)."""

from __future__ import annotations

import re

from accel_core.hostfiles import HostValueError, parse_index, parse_int
from neuron_dra.driver_sysfs import SysfsReader, show_value
from neuron_dra.facts import ultraserver as us_facts
from neuron_dra.facts.ultraserver import UltraServerIds
from neuron_dra.presence import CLASS_DIR


def read_ultraserver(reader: SysfsReader, problems: list[str]) -> UltraServerIds | None:
    """The class-level UltraServer attributes; None outside an UltraServer, when the driver has none of them, or
    when one is malformed (a problem naming the file)."""
    paths = {name: f"{CLASS_DIR}/{name}" for name in us_facts.CLASS_ATTRIBUTES}
    if not any(reader.exists(p) for p in paths.values()):
        return None  # a driver without UltraServer support
    found: list[str] = []
    texts = {name: reader.text(p, found) for name, p in paths.items()}
    values: dict[str, int | str] = {}
    for name in ("node_id_2", "node_id_4"):
        text = texts[name]
        if text is not None:
            try:
                values[name] = parse_int(text, paths[name], minimum=-1,
                                         maximum=1 if name == "node_id_2" else us_facts.NODES_PER_ULTRASERVER - 1)
            except HostValueError as exc:
                found.append(str(exc))
    for name in ("server_id_2", "server_id_4"):
        text = texts[name]
        if text is not None:
            body = text.strip()
            if len(body) != us_facts.SERVER_ID_DIGITS or not re.fullmatch(r"[0-9a-f]+", body):
                found.append(f"{paths[name]}: expected {us_facts.SERVER_ID_DIGITS} lower-case hex digits, "
                             f"got {show_value(text)}")
            else:
                values[name] = body
    modes: tuple[int, ...] = ()
    mode_text = (texts["ultraserver_mode"] or "").strip()
    busy = mode_text == us_facts.BUSY
    if mode_text and not busy:
        parts = [p.strip() for p in mode_text.split(",")]
        parsed = [parse_index(p) for p in parts]
        if any(v not in us_facts.RUNTIME_MODES for v in parsed):
            found.append(f"{paths['ultraserver_mode']}: expected 'busy' or a comma list of modes "
                         f"{', '.join(map(str, us_facts.ALL_RUNTIME_MODES))}, got {show_value(mode_text)}")
        else:
            modes = tuple(sorted({v for v in parsed if v is not None}))
    if found:
        problems.extend(f"{p}; UltraServer ids unknown" for p in found)
        return None
    node_ids = (values.get("node_id_2"), values.get("node_id_4"))
    outside = us_facts.NO_NODE_ID in node_ids
    if outside:
        if node_ids != (us_facts.NO_NODE_ID, us_facts.NO_NODE_ID) or modes:
            problems.append(f"{CLASS_DIR}: node_id_2/node_id_4/ultraserver_mode disagree about UltraServer membership "
                            f"(node ids {node_ids}, modes {list(modes) or mode_text!r}); UltraServer ids unknown")
        return None
    if us_facts.NO_SERVER_ID in (values["server_id_2"], values["server_id_4"]):
        problems.append(f"{CLASS_DIR}: node ids {node_ids} but a server id is {us_facts.NO_SERVER_ID}; "
                        "UltraServer ids unknown")
        return None
    return UltraServerIds(server_id_2=str(values["server_id_2"]), node_id_2=int(values["node_id_2"]),
                          server_id_4=str(values["server_id_4"]), node_id_4=int(values["node_id_4"]),
                          modes=modes, busy=busy)

