"""The simulated street behind the synthetic traffic video: constants, per-frame
conditions (`timeline`), every object's path (`simulate`), camera jitter. Pixels are
drawn by `traffic_render`, the truth and the file come from `synthetic` and
`traffic_writer`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GENERATOR_VERSION = 2  # bump whenever the truth or the pixels change
LABELS = ("car", "truck", "bus", "person")
CAR, TRUCK, BUS, PERSON = range(4)
DAY_PERIOD = 3600  # frames in one simulated day
WARMUP = 3000  # frames simulated before frame 0, so the street starts populated
MIN_VISIBLE_FRACTION = 0.3
MIN_SIDE = (4 / 320, 4 / 180)  # smallest clipped box side, as a fraction of (width, height)
CHUNK = 4096  # frames per block of placements and per random-stream block

# Rows where objects stand: ground line (fraction of height) and travel direction
# (0: each object picks one). Rows 0-3 far sidewalk, 4-9 lanes, 10-13 near sidewalk.
FAR_WALK = (0.372, 0.386, 0.400, 0.414)
LANES = ((0.49, -1), (0.565, -1), (0.64, -1), (0.745, 1), (0.835, 1), (0.925, 1))
NEAR_WALK = (0.962, 0.973, 0.984, 0.995)
ROW_GROUND = np.array(FAR_WALK + tuple(g for g, _ in LANES) + NEAR_WALK)
ROW_SCALE = 0.2 + 0.88 * ROW_GROUND  # perspective: apparent size and speed
FIRST_LANE_ROW = len(FAR_WALK)
LANE_DIRECTION = np.array([d for _, d in LANES])
LANE_FREE_SPEED = np.array([0.0095, 0.0110, 0.0120, 0.0120, 0.0110, 0.0095])  # width/frame at scale 1
LANE_CAR_SHARE = np.array([0.8, 1.0, 1.1, 1.1, 1.0, 0.8])
LANE_TRUCK_SHARE = np.array([1.0, 0.7, 0.2, 0.2, 0.7, 1.0])
BUS_LANE = {-1: 0, 1: 5}  # curb lanes
SPEED_FACTOR = {CAR: 1.0, TRUCK: 0.85, BUS: 0.8}  # of the lane's speed; slowed by congestion

# (length as fraction of width, height as fraction of height) at scale 1, per class variant
SHAPES = {
    CAR: ((0.14, 0.115), (0.12, 0.115), (0.145, 0.135), (0.155, 0.15)),  # sedan hatch suv van
    TRUCK: ((0.24, 0.21), (0.32, 0.22)),  # box truck, semi-trailer
    BUS: ((0.33, 0.21), (0.38, 0.21)),  # city bus, long bus
    PERSON: ((0.028, 0.15),),
}
COLOUR_WEIGHTS = {
    CAR: (0.22, 0.18, 0.17, 0.07, 0.08, 0.12, 0.04, 0.03, 0.04, 0.05),
    TRUCK: (0.4, 0.2, 0.2, 0.2),
    BUS: (0.4, 0.3, 0.3),
    PERSON: (1 / 16,) * 16,
}
VARIANT_WEIGHTS = {CAR: (0.45, 0.2, 0.25, 0.1), TRUCK: (0.6, 0.4), BUS: (0.7, 0.3), PERSON: (1.0,)}

CAR_RATE = 0.009  # arrivals per frame per lane at density 1
TRUCK_RATE = 0.00005  # truck arrivals per frame per lane at full daytime activity
BUS_EPISODE_GAP = 35000  # mean frames between bus episodes
FIRST_BUS_EPISODE = (1500, 7000)  # frame range of the first episode, so short videos have one
PERSON_RATE = 0.00045  # pedestrians per frame per sidewalk and direction at activity 1
HEADWAY_GAP = 0.025  # smallest bumper gap, fraction of width at scale 1
MAX_QUEUE_DELAY = 300  # frames an arrival may wait for room before it turns elsewhere
JITTER = 0.004  # camera jitter amplitude, fraction of width/height


def stream_rng(seed: int, *key: int) -> np.random.Generator:
    """Independent generator for one purpose and block of time, so prefixes stay stable."""
    return np.random.default_rng(np.random.SeedSequence([seed, *key]))


def _smooth_noise(seed: int, stream: int, t: np.ndarray, spacing: int) -> np.ndarray:
    """Standard normal noise varying smoothly over `spacing` frames (linear between knots)."""
    pos = (t + WARMUP) / spacing
    k0 = np.floor(pos).astype(np.int64)
    need = np.arange(k0.min(), k0.max() + 2)
    blocks = {b: stream_rng(seed, stream, int(b)).standard_normal(256) for b in np.unique(need // 256)}
    knots = np.array([blocks[k // 256][k % 256] for k in need])
    frac = pos - k0
    return knots[k0 - need[0]] * (1 - frac) + knots[k0 - need[0] + 1] * frac


def _bump(h: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((h - centre) / width) ** 2)


def _daytime(h: np.ndarray) -> np.ndarray:
    """1 between about 6:30 and 21:00, 0 at night, smooth edges."""
    return 1 / (1 + np.exp(-(h - 6.5) / 0.6)) / (1 + np.exp(-(21.0 - h) / 0.8))


@dataclass(frozen=True)
class Timeline:
    """Per-frame conditions over frames `t` (negative during warm-up)."""

    t: np.ndarray
    hour: np.ndarray  # time of day, 0-24
    daylight: np.ndarray  # 0 night .. 1 full day
    gain: np.ndarray  # scene brightness multiplier, with passing clouds
    density: np.ndarray  # car arrival intensity, about 0.04 at night to 1+ at rush hour
    activity: np.ndarray  # daytime activity (trucks, pedestrians), 0.1 night .. ~1.5
    waves: np.ndarray  # (2, n) arrival multipliers from upstream signals, per direction


def timeline(seed: int, t: np.ndarray) -> Timeline:
    start = 6.5 / 24 + stream_rng(seed, 1).uniform(-0.02, 0.02)
    days = start + t / DAY_PERIOD
    hour = (days % 1.0) * 24
    sun = -np.cos(2 * np.pi * days)
    x = np.clip((sun + 0.2) / 0.5, 0, 1)
    daylight = x * x * (3 - 2 * x)
    clouds = np.clip(1 + 0.06 * _smooth_noise(seed, 2, t, 400), 0.8, 1.1)
    gain = 0.22 + 0.78 * daylight * clouds
    day_index = np.floor(days).astype(np.int64)
    day_factor = np.exp(0.15 * np.array([stream_rng(seed, 3, int(d) + 2).standard_normal() for d in
                                          range(day_index.min(), day_index.max() + 1)]))
    plateau = _daytime(hour)
    rush = 0.75 * _bump(hour, 8.2, 1.1) + 0.7 * _bump(hour, 17.6, 1.3)
    density = ((0.04 + 0.3 * plateau + rush) * day_factor[day_index - day_index.min()]
               * np.exp(0.25 * _smooth_noise(seed, 4, t, 600)))
    activity = 0.1 + plateau + 0.5 * rush
    phase = stream_rng(seed, 5).uniform(0, 2 * np.pi, 2)
    waves = np.stack([1 + 0.6 * np.tanh(3 * np.sin(2 * np.pi * t / period + p))
                      for period, p in zip((280.0, 330.0), phase, strict=True)])
    return Timeline(t, hour, daylight, gain, density, activity, waves)


@dataclass(frozen=True)
class Objects:
    """Every simulated object; position of its front along its path at frame t is
    `speed * (t - t0 - clip(t - t_stop, 0, dwell))` in widths, entering at 0."""

    kind: np.ndarray
    variant: np.ndarray
    colour: np.ndarray
    row: np.ndarray
    direction: np.ndarray  # +1 moves right, -1 left
    t0: np.ndarray
    speed: np.ndarray  # apparent, widths per frame
    t_stop: np.ndarray
    dwell: np.ndarray

    @property
    def length(self) -> np.ndarray:
        return _shape_table()[0][self.kind, self.variant] * ROW_SCALE[self.row]

    @property
    def height(self) -> np.ndarray:
        return _shape_table()[1][self.kind, self.variant] * ROW_SCALE[self.row]

    @property
    def sprite_code(self) -> np.ndarray:
        """One integer per distinct look (class, variant, colour, row, direction)."""
        return (((self.kind * 4 + self.variant) * 16 + self.colour) * 16 + self.row) * 2 + (
            self.direction > 0)


def decode_sprite_code(code: int) -> tuple[int, int, int, int, int]:
    """(kind, variant, colour, row, direction) of a `sprite_code`."""
    code, right = divmod(code, 2)
    code, row = divmod(code, 16)
    code, colour = divmod(code, 16)
    kind, variant = divmod(code, 4)
    return kind, variant, colour, row, 1 if right else -1


def _shape_table() -> tuple[np.ndarray, np.ndarray]:
    length = np.zeros((4, 4))
    height = np.zeros((4, 4))
    for kind, shapes in SHAPES.items():
        for v, (ln, ht) in enumerate(shapes):
            length[kind, v], height[kind, v] = ln, ht
    return length, height


def pixel_size(kind, variant, row, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Sprite (= box) width and height in pixels for objects of these looks at a resolution."""
    length, tall = _shape_table()
    scale = ROW_SCALE[row]
    w = np.maximum(2, np.rint(length[kind, variant] * scale * width)).astype(np.int64)
    h = np.maximum(2, np.rint(tall[kind, variant] * scale * height)).astype(np.int64)
    return w, h


def _poisson_arrivals(seed: int, stream: int, rate: np.ndarray, upper: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (warm-up frame axis) of a Poisson process with per-frame `rate`
    (<= upper, a constant so that prefixes stay stable), by thinning, block by block; and a
    row of 8 uniforms per arrival."""
    times, attrs = [], []
    for b in range((len(rate) + CHUNK - 1) // CHUNK):
        rng = stream_rng(seed, stream, b)
        n = rng.poisson(upper * CHUNK)
        t = b * CHUNK + rng.uniform(0, CHUNK, n)
        keep_u = rng.uniform(0, upper, n)
        u = rng.uniform(size=(n, 8))
        inside = t < len(rate)
        keep = inside.copy()
        keep[inside] = keep_u[inside] < rate[t[inside].astype(np.int64)]
        order = np.argsort(t[keep], kind="stable")
        times.append(t[keep][order])
        attrs.append(u[keep][order])
    return np.concatenate(times), np.concatenate(attrs).reshape(-1, 8)


def _pick(weights: tuple[float, ...], u: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(weights) / np.sum(weights)
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(weights) - 1)


def _bus_arrivals(seed: int, end: float) -> list[tuple[float, int, float, float, float]]:
    """(time, direction, u_variant, u_colour, u_speed) of buses, in clustered episodes."""
    buses = []
    t = WARMUP + stream_rng(seed, 6).uniform(*FIRST_BUS_EPISODE)
    k = 0
    while t < end:
        rng = stream_rng(seed, 7, k)
        for _ in range(1 + rng.binomial(2, 0.5)):
            buses.append((t + rng.uniform(0, 120), int(rng.choice((-1, 1))), *rng.uniform(size=3)))
        t += BUS_EPISODE_GAP * rng.uniform(0.6, 1.4)
        k += 1
    return buses


def simulate(seed: int, n_frames: int) -> Objects:
    """All vehicles and pedestrians that can be seen in frames [0, n_frames)."""
    span = n_frames + WARMUP
    tl = timeline(seed, np.arange(-WARMUP, n_frames, dtype=np.float64))
    parts = [_lane_traffic(seed, lane, tl, span) for lane in range(len(LANES))]
    parts.append(_pedestrians(seed, tl))
    cols = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    cols["t0"] = cols["t0"] - WARMUP
    cols["t_stop"] = cols["t_stop"] - WARMUP
    return Objects(**cols)


def _lane_traffic(seed: int, lane: int, tl: Timeline, span: int) -> dict[str, np.ndarray]:
    """Cars, trucks and buses of one lane, queued so that no two ever overlap."""
    direction = int(LANE_DIRECTION[lane])
    wave = tl.waves[0 if direction < 0 else 1]
    car_top = CAR_RATE * LANE_CAR_SHARE[lane] * 4.0
    car_rate = np.minimum(CAR_RATE * LANE_CAR_SHARE[lane] * tl.density * wave, car_top)
    car_t, car_u = _poisson_arrivals(seed, 100 + lane, car_rate, car_top)
    truck_top = TRUCK_RATE * LANE_TRUCK_SHARE[lane] * 1.25
    truck_rate = TRUCK_RATE * LANE_TRUCK_SHARE[lane] * (0.25 + _daytime(tl.hour))
    truck_t, truck_u = _poisson_arrivals(seed, 200 + lane, truck_rate, truck_top)
    arrivals = [(t, CAR, u) for t, u in zip(car_t, car_u, strict=True)]
    arrivals += [(t, TRUCK, u) for t, u in zip(truck_t, truck_u, strict=True)]
    arrivals += [(t, BUS, np.array([uv, uc, us, 0, 0, 0, 0, 0]))
                 for t, d, uv, uc, us in _bus_arrivals(seed, span) if BUS_LANE[d] == lane]
    arrivals.sort(key=lambda a: (a[0], a[1]))

    scale = ROW_SCALE[FIRST_LANE_ROW + lane]
    lengths = _shape_table()[0]
    rows = []
    lead = None  # (t0, speed, length) of the vehicle ahead
    for t, kind, u in arrivals:
        variant = int(_pick(VARIANT_WEIGHTS[kind], u[0]))
        colour = int(_pick(COLOUR_WEIGHTS[kind], u[1]))
        congestion = min(float(tl.density[min(int(t), span - 1)]), 1.2)
        speed = (LANE_FREE_SPEED[lane] * SPEED_FACTOR[kind] * (1 - 0.5 * congestion)
                 * np.exp(0.34 * (u[2] - 0.5)) * scale)
        length = lengths[kind, variant] * scale
        t0 = t
        if lead is not None:
            lt0, lspeed, llength = lead
            gap = HEADWAY_GAP * scale
            t0 = max(t0, lt0 + (llength + gap) / lspeed)
            t_exit = lt0 + (1 + llength + 0.05) / lspeed
            t0 = max(t0, t_exit - (1.05 - gap) / speed)
        if t0 - t > MAX_QUEUE_DELAY:
            continue
        rows.append((kind, variant, colour, t0, speed))
        lead = (t0, speed, length)
    arr = np.array(rows, dtype=np.float64).reshape(-1, 5)
    n = len(arr)
    return dict(kind=arr[:, 0].astype(np.int64), variant=arr[:, 1].astype(np.int64),
                colour=arr[:, 2].astype(np.int64),
                row=np.full(n, FIRST_LANE_ROW + lane, dtype=np.int64),
                direction=np.full(n, direction, dtype=np.int64), t0=arr[:, 3],
                speed=arr[:, 4], t_stop=arr[:, 3], dwell=np.zeros(n))


def _pedestrians(seed: int, tl: Timeline) -> dict[str, np.ndarray]:
    """Walkers on both sidewalks in both directions; some stop for a while."""
    rate = PERSON_RATE * tl.activity
    parts = []
    for side, first_row in enumerate((0, FIRST_LANE_ROW + len(LANES))):
        for d_index, direction in enumerate((-1, 1)):
            t, u = _poisson_arrivals(seed, 300 + 2 * side + d_index, rate, PERSON_RATE * 2.0)
            row = first_row + np.minimum((u[:, 0] * 4).astype(np.int64), 3)
            speed = (0.0007 + 0.0006 * u[:, 1]) * ROW_SCALE[row]
            stops = u[:, 2] < 0.3
            t_stop = t + (0.1 + 0.8 * u[:, 3]) / speed
            dwell = np.where(stops, 60 + 840 * u[:, 4], 0.0)
            parts.append(dict(kind=np.full(len(t), PERSON, dtype=np.int64),
                              variant=np.zeros(len(t), dtype=np.int64),
                              colour=np.minimum((u[:, 5] * 16).astype(np.int64), 15), row=row,
                              direction=np.full(len(t), direction, dtype=np.int64), t0=t,
                              speed=speed, t_stop=t_stop, dwell=dwell))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def jitter(seed: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Camera offset per frame as fractions of width and height: sway plus gusts."""
    rng = stream_rng(seed, 8)
    out = []
    for axis in range(2):
        periods = rng.uniform(25, 200, 3)
        phases = rng.uniform(0, 2 * np.pi, 3)
        sway = sum(np.sin(2 * np.pi * t / p + f) for p, f in zip(periods, phases, strict=True)) / 2
        gust = 1 + np.clip(_smooth_noise(seed, 9 + axis, t, 300), 0, None)
        out.append(JITTER * np.clip(sway * gust, -2.5, 2.5))
    return out[0], out[1]


@dataclass(frozen=True)
class Placements:
    """Every drawn object in a range of frames, sorted by frame then back to front."""

    frame: np.ndarray
    obj: np.ndarray  # index into the scene's Objects
    x1: np.ndarray  # unclipped integer box in image pixels
    y1: np.ndarray
    x2: np.ndarray
    y2: np.ndarray
    visible: np.ndarray  # fraction of the box inside the image and not covered
    in_truth: np.ndarray  # bool: obeys the truth rule
    moving: np.ndarray  # bool: walking (pedestrians) or driving
