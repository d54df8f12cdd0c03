"""Frozen schedules: every protocol, option and availability feature gives exactly the schedule it gave before the
arrival protocols were rebuilt around one event loop (``asyncfl_jax.timing.events``).

``FROZEN`` holds a SHA-256 digest of every field of ``make_schedule(...)`` for each configuration of ``CONFIGS``,
computed with the code before that change (one loop per protocol variant). Delay models use only products and sums of
uniforms, so durations are bit-identical on every platform; suspension lengths and Poisson gaps go through ``log``,
whose last bit may differ between math libraries, so for configurations that use them the float fields are hashed
rounded to 10 significant digits (the integer fields, i.e. every choice the loop makes, are always hashed exactly).

Regenerate (only when a schedule is meant to change): ``python tests/test_timing_frozen.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from typing import Any

import numpy as np
import pytest

from asyncfl_jax.timing import DelayModel, Schedule, make_schedule
from asyncfl_jax.timing.schedule import _ARRAY_FIELDS

ARITH = {"speed": "uniform", "speed_low": 0.5, "speed_high": 4.0, "noise": "uniform", "noise_low": 0.5,
         "noise_high": 1.5}
MODELS: dict[str, dict[str, Any]] = {
    "arith": ARITH,
    "constant": DelayModel.constant(1.0).to_dict(),  # every job takes 1: ties everywhere
    "zero": {"speed": "constant", "speed_value": 0.0, "noise": "none"},  # every event at time 0
    "add": {**ARITH, "combine": "add", "comm_time": 0.25},
    "drop": {**ARITH, "dropout_fraction": 0.25, "dropout_time": 12.0},
    "drop_const": {**DelayModel.constant(1.0).to_dict(), "dropout_fraction": 0.3, "dropout_time": 5.0},
    "susp": {**ARITH, "suspension_prob": 0.3, "suspension_mean": 3.0},
    "susp_const": {**DelayModel.constant(1.0).to_dict(), "suspension_prob": 0.5, "suspension_mean": 2.0},
    "both": {**ARITH, "dropout_fraction": 0.2, "dropout_time": 15.0, "suspension_prob": 0.25,
             "suspension_mean": 4.0},
}
# Models whose floats go through log (suspension lengths): hashed rounded, see the module docstring.
TRANSCENDENTAL = {"susp", "susp_const", "both"}


_SHORT = {"concurrency": "Mc", "buffer_size": "M", "period": "p", "rate": "r", "participants": "m"}


def _configs() -> list[tuple[str, str, int, int, str, int, dict[str, Any]]]:
    """(name, protocol, n, T, model, seed, options)."""
    out = []

    def add(protocol: str, n: int, T: int, model: str, seed: int, **options: Any) -> None:
        opts = ",".join(f"{_SHORT.get(k, k)}{v}" if k in _SHORT else str(v) for k, v in options.items())
        out.append((f"{protocol}/{model}/n{n}/T{T}/s{seed}/{opts}", protocol, n, T, model, seed, options))

    for model in ("arith", "constant", "zero", "add"):
        for refill in ("immediate", "boundary"):
            add("concurrent", 30, 80, model, 3, concurrency=10, buffer_size=3, refill=refill)
            add("concurrent", 12, 60, model, 0, concurrency=12, buffer_size=4, refill=refill)
        add("concurrent", 40, 300, model, 1, concurrency=40, buffer_size=1)  # the all-active fast path
        add("all_active", 50, 400, model, 2)
        add("synchronous", 20, 25, model, 4)
        add("synchronous", 20, 25, model, 4, participants=7)
    add("concurrent", 5, 50, "arith", 9, concurrency=1, buffer_size=1, refill="boundary")
    add("all_active", 300, 1500, "arith", 11)
    for model in ("arith", "constant", "drop", "susp", "both"):
        add("concurrent", 30, 60, model, 5, concurrency=8, aggregation="periodic", period=1.5)
        add("concurrent", 30, 60, model, 6, concurrency=8, aggregation="poisson", rate=2.0)
        add("all_active", 25, 60, model, 7, aggregation="periodic", period=0.7)
        add("all_active", 25, 60, model, 8, aggregation="poisson", rate=3.0)
    for model in ("drop", "drop_const", "susp", "susp_const", "both"):
        for refill in ("immediate", "boundary"):
            add("concurrent", 40, 80, model, 10, concurrency=12, buffer_size=3, refill=refill)
        add("concurrent", 40, 80, model, 10, concurrency=40, buffer_size=1)
        add("all_active", 30, 200, model, 12)
        add("synchronous", 30, 40, model, 13)
        add("synchronous", 30, 40, model, 13, participants=8)
    for model in ("arith", "both"):
        add("concurrent", 20, 15, model, 14, concurrency=6, aggregation="periodic", period=math.inf)
        add("all_active", 20, 15, model, 15, aggregation="periodic", period=math.inf)
    return out


CONFIGS = _configs()


def digest(s: Schedule, exact: bool = True) -> str:
    """SHA-256 (first 128 bits) of every array field (dtype, shape, bytes), ``num_slots``, ``init_time`` and
    ``info``; with ``exact=False`` float arrays are hashed as their values rounded to 10 significant digits."""
    h = hashlib.sha256()
    for f in _ARRAY_FIELDS:
        a = np.ascontiguousarray(getattr(s, f))
        h.update(f"{f}|{a.dtype}|{a.shape}|".encode())
        if a.dtype.kind == "f" and not exact:
            h.update(" ".join(f"{v:.10g}" for v in a.ravel().tolist()).encode())
        else:
            h.update(a.tobytes())
    h.update(f"{s.num_clients}|{s.num_slots}|{s.init_time!r}|".encode())
    h.update(json.dumps(s.info, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


def build(protocol: str, n: int, T: int, model: str, seed: int, options: dict[str, Any]) -> Schedule:
    return make_schedule(protocol, n, T, DelayModel.from_dict(MODELS[model]), seed, **options)


def _exact(model: str, options: dict[str, Any]) -> bool:
    return model not in TRANSCENDENTAL and options.get("aggregation") != "poisson"


FROZEN = {
    'concurrent/arith/n30/T80/s3/Mc10,M3,immediate': '8eb482b1ccca81b175353468a9745bf7',
    'concurrent/arith/n12/T60/s0/Mc12,M4,immediate': 'c6e1ae08026eee3b8cbd283011ec9797',
    'concurrent/arith/n30/T80/s3/Mc10,M3,boundary': 'cfd576a76369cbfb6c3802bf7b9d2280',
    'concurrent/arith/n12/T60/s0/Mc12,M4,boundary': 'a5e9836058658d8cdcece247acf1de60',
    'concurrent/arith/n40/T300/s1/Mc40,M1': 'f3b33a59aa630ca309dabc0636f4d4d8',
    'all_active/arith/n50/T400/s2/': '4456530202d8b37cdbd1b91cf1e555b5',
    'synchronous/arith/n20/T25/s4/': 'f3db7bed76de7cdc2eecfd122994459b',
    'synchronous/arith/n20/T25/s4/m7': '210829ff707a747a51d489554f8cfec2',
    'concurrent/constant/n30/T80/s3/Mc10,M3,immediate': '3b0b78759484e7aa98197fdbf4972974',
    'concurrent/constant/n12/T60/s0/Mc12,M4,immediate': 'f24f031fb7789550175320ce264fc08b',
    'concurrent/constant/n30/T80/s3/Mc10,M3,boundary': '721ba26c14c020224a91be04d41874ac',
    'concurrent/constant/n12/T60/s0/Mc12,M4,boundary': '0e12e3327b84356d8622f278140825bb',
    'concurrent/constant/n40/T300/s1/Mc40,M1': 'a67e02659eda6d2bcf09db5534f777c4',
    'all_active/constant/n50/T400/s2/': '2e2f1e1b4f8fc959fc814f1fb47b5393',
    'synchronous/constant/n20/T25/s4/': 'd5a4459c62f1ab50a9333259d5a0e42a',
    'synchronous/constant/n20/T25/s4/m7': 'b574a3a422cd77c41b25429563d3a7c2',
    'concurrent/zero/n30/T80/s3/Mc10,M3,immediate': '94ed6c6d12b44cd032e339e049792a8f',
    'concurrent/zero/n12/T60/s0/Mc12,M4,immediate': 'aa14eaf5c7ad90d41c6069e8ea618413',
    'concurrent/zero/n30/T80/s3/Mc10,M3,boundary': 'eb134785eaae625f253286e6c3ff2a7a',
    'concurrent/zero/n12/T60/s0/Mc12,M4,boundary': '64b50c8410cc10e90aac0b9ca0df981c',
    'concurrent/zero/n40/T300/s1/Mc40,M1': 'a833f6b51af02cbaab3828dbf75c9522',
    'all_active/zero/n50/T400/s2/': 'e39350da5d37760c12f7ce6b15a9aef9',
    'synchronous/zero/n20/T25/s4/': '3a1b07be81556987ae106fba89d40e03',
    'synchronous/zero/n20/T25/s4/m7': '1b7aa5f5d93fd5c1ba18003bbe787aef',
    'concurrent/add/n30/T80/s3/Mc10,M3,immediate': 'e64d605970f18fdf9b666d151aed8b36',
    'concurrent/add/n12/T60/s0/Mc12,M4,immediate': '40d7adb763ccca6e4cd1c7503efc7880',
    'concurrent/add/n30/T80/s3/Mc10,M3,boundary': '7f0f34e341edab3fce9b7e03f6f6223d',
    'concurrent/add/n12/T60/s0/Mc12,M4,boundary': '40f694719d3d97338db3bd6bf5a00fc8',
    'concurrent/add/n40/T300/s1/Mc40,M1': 'e16981365225d75f5c660c64f89bc7c4',
    'all_active/add/n50/T400/s2/': 'a7108f4a219e6eaa68b93c6184e9e01b',
    'synchronous/add/n20/T25/s4/': '848a73b8f10a3f2a3ce703d8b154d9fb',
    'synchronous/add/n20/T25/s4/m7': 'c948d81e2e5aec63e8231b33ea4ceecf',
    'concurrent/arith/n5/T50/s9/Mc1,M1,boundary': '04c8b70c414c719cc06c5c1e3d8d9e9d',
    'all_active/arith/n300/T1500/s11/': 'eb9c49a7ca91c370765c42d3d3cac66f',
    'concurrent/arith/n30/T60/s5/Mc8,periodic,p1.5': '92373a6320cf94040f996578a02bb332',
    'concurrent/arith/n30/T60/s6/Mc8,poisson,r2.0': 'e6d8f7949ba8cb4366c0b6fb393e1816',
    'all_active/arith/n25/T60/s7/periodic,p0.7': '462627b67fa4c1f0b089838cd763ca35',
    'all_active/arith/n25/T60/s8/poisson,r3.0': '55a3c52488120a1211ebb5c18b44fbae',
    'concurrent/constant/n30/T60/s5/Mc8,periodic,p1.5': '966fa645de9d5cdee70f04c710b20396',
    'concurrent/constant/n30/T60/s6/Mc8,poisson,r2.0': '446b56cf2793aed0081ec790e7cc270a',
    'all_active/constant/n25/T60/s7/periodic,p0.7': '6d26b9190f7ccdd0ccae37f155e7401c',
    'all_active/constant/n25/T60/s8/poisson,r3.0': '31da6fff5fbc49f002dde5714ba1109c',
    'concurrent/drop/n30/T60/s5/Mc8,periodic,p1.5': '0c0dabb4b209315cc0b4f8ad9983c3a5',
    'concurrent/drop/n30/T60/s6/Mc8,poisson,r2.0': 'b91b9355f11139fa945b36fcfd226a58',
    'all_active/drop/n25/T60/s7/periodic,p0.7': '93fb1257bfb58beba5fffab3042f5fa4',
    'all_active/drop/n25/T60/s8/poisson,r3.0': '8ad4abc0da43abed6f3fe98101957c8c',
    'concurrent/susp/n30/T60/s5/Mc8,periodic,p1.5': '9634127c81b7d88b6c7bdb55a9f9b31e',
    'concurrent/susp/n30/T60/s6/Mc8,poisson,r2.0': 'f97273e6dc55e3df5be129d47a5c9bb8',
    'all_active/susp/n25/T60/s7/periodic,p0.7': '20bcf6e99720db65c909d728d5d35038',
    'all_active/susp/n25/T60/s8/poisson,r3.0': '81d00de32d3ff2844390f5bbd5a684b1',
    'concurrent/both/n30/T60/s5/Mc8,periodic,p1.5': '67d1ac83c0d0fccffef47d75d8da00e9',
    'concurrent/both/n30/T60/s6/Mc8,poisson,r2.0': '15531501d51dfc8ef6d9738723d6c8e0',
    'all_active/both/n25/T60/s7/periodic,p0.7': '3b333b755510a532df7e16eec6ca559d',
    'all_active/both/n25/T60/s8/poisson,r3.0': '6002a0b0b28d40110c9c41d768c28597',
    'concurrent/drop/n40/T80/s10/Mc12,M3,immediate': 'e8016bcbf1814149435064b8a79c6f83',
    'concurrent/drop/n40/T80/s10/Mc12,M3,boundary': '9226211650925410b21357f2675b9ff2',
    'concurrent/drop/n40/T80/s10/Mc40,M1': '053ae80b453ad7c825a535d6ac2c8719',
    'all_active/drop/n30/T200/s12/': 'd263998dd1696b8b6a5885a3221f1fcb',
    'synchronous/drop/n30/T40/s13/': 'b54a7ab67f94568046f5c32bb2deb8e6',
    'synchronous/drop/n30/T40/s13/m8': 'ee89b0d73bf2d5fb6153e231f18907e7',
    'concurrent/drop_const/n40/T80/s10/Mc12,M3,immediate': '4ef04a27fcc2647f948d6bb410fb101a',
    'concurrent/drop_const/n40/T80/s10/Mc12,M3,boundary': 'd19b31d30db0d3c052bf75c566599880',
    'concurrent/drop_const/n40/T80/s10/Mc40,M1': '2008d3a7a0b90199f9d28f99fd5a342c',
    'all_active/drop_const/n30/T200/s12/': '24f34f1843e860b276b3c3f9e28d18b3',
    'synchronous/drop_const/n30/T40/s13/': '3e3a9a5c6d813ef57655804d377d4a46',
    'synchronous/drop_const/n30/T40/s13/m8': '0e6599fa999e0d636157ea60f2ad82c9',
    'concurrent/susp/n40/T80/s10/Mc12,M3,immediate': '2768c3f95d01ec60ec26fe05c58a1079',
    'concurrent/susp/n40/T80/s10/Mc12,M3,boundary': '584de2682a96e85635b974fbfbfdf458',
    'concurrent/susp/n40/T80/s10/Mc40,M1': '1f3085ce046e34db4982a1a089b079a8',
    'all_active/susp/n30/T200/s12/': '16b7d4252ec641294c94809a07a655c0',
    'synchronous/susp/n30/T40/s13/': 'b2acb8cb0131e6b4bdb892f71a5ad727',
    'synchronous/susp/n30/T40/s13/m8': 'cf47494654b399f580459a5eb79bcb7e',
    'concurrent/susp_const/n40/T80/s10/Mc12,M3,immediate': '3661a0b2b0f466e914953008567172f1',
    'concurrent/susp_const/n40/T80/s10/Mc12,M3,boundary': '6fd978bb79c5da594a74191b40ff79b2',
    'concurrent/susp_const/n40/T80/s10/Mc40,M1': 'cac528fc0469116b1aab4cd1bb2c9bcd',
    'all_active/susp_const/n30/T200/s12/': 'e94f0412d8a1fcf870cc4c918d571900',
    'synchronous/susp_const/n30/T40/s13/': '7bcc1bb59b3993d9e9b64e3138771ca5',
    'synchronous/susp_const/n30/T40/s13/m8': '053d858a1a4b5b3f63bf3d7846b97d3f',
    'concurrent/both/n40/T80/s10/Mc12,M3,immediate': '3537182ab9d60281bd5e1128326a1a9b',
    'concurrent/both/n40/T80/s10/Mc12,M3,boundary': '3ea28fdd21ef7ebfd646c3b241b90be4',
    'concurrent/both/n40/T80/s10/Mc40,M1': '110db20c464717a89fdefbfe06a5a5db',
    'all_active/both/n30/T200/s12/': '0eed0373d960b38b4fbec23088d406d0',
    'synchronous/both/n30/T40/s13/': '66c2825e6f2a4f319eb2a9ca046395e5',
    'synchronous/both/n30/T40/s13/m8': '83c6c63b0727476fb6207eee2fa91db4',
    'concurrent/arith/n20/T15/s14/Mc6,periodic,pinf': '1aa50806fbcad66596f92b04a2367e9d',
    'all_active/arith/n20/T15/s15/periodic,pinf': 'd49522c41710e7141170a9f22a751977',
    'concurrent/both/n20/T15/s14/Mc6,periodic,pinf': '10c0acaca980562377626b82965f52f5',
    'all_active/both/n20/T15/s15/periodic,pinf': 'c382af8d16d9227202673aa1ed3116a6',
}


def test_grid_covers_every_config():
    assert len({c[0] for c in CONFIGS}) == len(CONFIGS)
    assert set(FROZEN) == {c[0] for c in CONFIGS}


@pytest.mark.parametrize("name, protocol, n, T, model, seed, options", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_schedule_is_frozen(name, protocol, n, T, model, seed, options):
    s = build(protocol, n, T, model, seed, options)
    s.validate()
    assert digest(s, _exact(model, options)) == FROZEN[name]


if __name__ == "__main__":  # prints the FROZEN table for the current code
    sys.stdout.write("FROZEN = {\n")
    for name, protocol, n, T, model, seed, options in CONFIGS:
        d = digest(build(protocol, n, T, model, seed, options), _exact(model, options))
        sys.stdout.write(f"    {name!r}: {d!r},\n")
    sys.stdout.write("}\n")
