"""scripts/kvzap_mlp.py on a synthetic dump: a linear target is recovered by both predictors, a
nonlinear one only by the MLP; the dump's layout is the one `calibrate --dump-pairs` writes."""
import importlib.util
import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kvzap_mlp", ROOT / "scripts" / "kvzap_mlp.py")
km = importlib.util.module_from_spec(spec)
spec.loader.exec_module(km)


def dump(folder, scores_of, windows=5, n=400, d=6):
    """One layer, two KV heads; window 4 held out. scores_of(x) -> [2, n] scores in (0, 1]."""
    rng = np.random.default_rng(1)
    entries = []
    for i in range(windows):
        x = rng.normal(size=(1, n, d)).astype("<f4")
        s = scores_of(x[0]).astype("<f4")[None]
        np.concatenate([x.ravel(), s.ravel()]).astype("<f4").tofile(folder / f"window-{i:03}.f32")
        entries.append({"file": f"window-{i:03}.f32", "tokens": n, "held_out": i == windows - 1})
    (folder / "manifest.json").write_text(json.dumps(
        {"model": "synthetic", "layers": 1, "kv_heads": 2, "hidden": d, "text": "-", "seq_len": n, "windows": entries}))


def test_linear_target_both_fit_nonlinear_only_the_mlp(tmp_path):
    lin, curved = tmp_path / "lin", tmp_path / "curved"
    lin.mkdir()
    curved.mkdir()
    dump(lin, lambda x: np.exp(np.stack([x[:, 0] - 3, -x[:, 1] - 3]).clip(max=0)))
    dump(curved, lambda x: np.exp(np.stack([-2 * np.abs(x[:, 0]), -(x[:, 1] ** 2)])))
    got = {}
    for name, folder in (("lin", lin), ("curved", curved)):
        m, train, held = km.load(folder)
        x = np.concatenate([w[0][0] for w in train])
        y = km.target(np.concatenate([w[1][0] for w in train], axis=1))
        xh, yh = held[0][0][0], km.target(held[0][1][0])
        preds = {"linear": [km.fit_linear(x, y, xh, yh)], "mlp": [km.fit_mlp(x, y, xh, yh, 16, 150, 0)]}
        got[name] = {k: km.quality(p, held) for k, p in preds.items()}
    assert got["lin"]["linear"]["r2_mean"] > 0.99
    assert got["lin"]["mlp"]["spearman_mean"] > 0.95
    assert got["curved"]["linear"]["spearman_mean"] < 0.3
    assert got["curved"]["mlp"]["spearman_mean"] > 0.9


def test_a_dump_of_the_wrong_size_is_refused(tmp_path):
    dump(tmp_path, lambda x: np.ones((2, len(x))))
    (tmp_path / "window-001.f32").write_bytes(b"\0" * 12)
    try:
        km.load(tmp_path)
    except SystemExit as e:
        assert "window-001.f32 holds 3 values" in str(e)
    else:
        raise AssertionError("a short window file must be refused")
