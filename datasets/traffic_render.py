"""Pixels of a `TrafficScene`: a static street drawn once, sprites pasted per frame.

Speed comes from doing little per frame: the background for each light level is prepared
once (tone curve + night lights) and sliced at the camera offset; sprites are drawn once per
look and light level (supersampled, then shrunk) and pasted with a mask; headlights are added
at night; sensor noise is sliced from a pre-drawn bank at a random offset.
"""
from __future__ import annotations

from itertools import pairwise
from typing import Iterator

import cv2
import numpy as np

from .traffic_model import (BUS, CAR, FIRST_LANE_ROW, JITTER, LANES, PERSON, ROW_GROUND, TRUCK,
                            Placements, decode_sprite_code, pixel_size, stream_rng, timeline)

LEVELS = 96  # quantised scene gains (steps of about 2 grey levels)
GAIN_RANGE = (0.22, 1.1)
NOISE_SIGMAS = (2.0, 3.5, 5.0, 6.5)  # grey levels, by darkness
NOISE_PAD = 16
SUPERSAMPLE = 4
CACHED_LEVELS = 3

CAR_COLOURS = ((235, 235, 232), (172, 174, 180), (38, 38, 42), (178, 32, 30), (34, 62, 150),
               (100, 102, 106), (34, 92, 54), (222, 190, 44), (122, 80, 44), (205, 205, 215))
TRUCK_COLOURS = ((240, 240, 236), (196, 64, 34), (58, 100, 168), (228, 200, 72))
BUS_COLOURS = ((232, 168, 24), (38, 118, 200), (196, 40, 40))
SHIRTS = ((200, 40, 40), (40, 70, 160), (230, 230, 225), (30, 30, 30), (60, 140, 70),
          (230, 180, 40), (140, 60, 140), (120, 120, 120))
TROUSERS = ((40, 45, 70), (90, 80, 70))
SKINS = ((235, 195, 160), (190, 140, 100), (120, 80, 55))
WINDOW = (52, 62, 78)
TYRE = (24, 24, 26)
HUB = (125, 125, 128)
HEADLAMP = (255, 246, 215)
TAIL_LAMP = (200, 22, 14)


def _darkness(gain: np.ndarray | float) -> np.ndarray | float:
    return np.clip((0.6 - gain) / 0.38, 0.0, 1.0)


def _level_gain(level: int) -> float:
    return GAIN_RANGE[0] + (GAIN_RANGE[1] - GAIN_RANGE[0]) * level / (LEVELS - 1)


def _tone_curve(level: int) -> np.ndarray:
    """Per-channel lookup table (256x1x3) for one light level: dim, tinted, low contrast."""
    gain = _level_gain(level)
    dark = float(_darkness(gain))
    dusk = float(np.exp(-0.5 * ((gain - 0.5) / 0.12) ** 2))
    tint = np.array([1 - 0.15 * dark + 0.08 * dusk, 1 - 0.05 * dark, 1 + 0.1 * dark - 0.08 * dusk])
    v = np.arange(256, dtype=np.float64)[:, None]
    out = 4 + 12 * dark + gain * tint[None, :] * v * (1 - 0.2 * dark)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8).reshape(256, 1, 3)


class _Painter:
    """Draws polygons, boxes and discs given in unit coordinates of a box at 4x resolution."""

    def __init__(self, w: int, h: int):
        self.W, self.H = w * SUPERSAMPLE, h * SUPERSAMPLE
        self.w, self.h = w, h
        self.rgb = np.zeros((self.H, self.W, 3), np.float32)
        self.mask = np.zeros((self.H, self.W), np.float32)

    def _pts(self, pts) -> np.ndarray:
        return np.array([[round(u * self.W), round(v * self.H)] for u, v in pts], np.int32)

    def poly(self, pts, colour, opaque: bool = True) -> None:
        p = self._pts(pts)
        cv2.fillPoly(self.rgb, [p], tuple(float(c) for c in colour))
        if opaque:
            cv2.fillPoly(self.mask, [p], 1.0)

    def box(self, u0, v0, u1, v1, colour, opaque: bool = True) -> None:
        self.poly([(u0, v0), (u1, v0), (u1, v1), (u0, v1)], colour, opaque)

    def disc(self, u, v, r_px: float, colour) -> None:
        centre = (round(u * self.W), round(v * self.H))
        radius = max(1, round(r_px * SUPERSAMPLE))
        cv2.circle(self.rgb, centre, radius, tuple(float(c) for c in colour), -1)
        cv2.circle(self.mask, centre, radius, 1.0, -1)

    def done(self, direction: int) -> tuple[np.ndarray, np.ndarray]:
        """Shrunk RGB (colours un-premultiplied at edges) and a boolean mask (h, w, 1)."""
        cover = cv2.resize(self.mask, (self.w, self.h), interpolation=cv2.INTER_AREA)
        rgb = cv2.resize(self.rgb * self.mask[..., None], (self.w, self.h),
                         interpolation=cv2.INTER_AREA) / np.maximum(cover, 1e-6)[..., None]
        rgb = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
        mask = (cover >= 0.5)[..., None]
        if direction < 0:
            rgb, mask = rgb[:, ::-1], mask[:, ::-1]
        return np.ascontiguousarray(rgb), np.ascontiguousarray(mask)


def _wheels(p: _Painter, us, r_frac: float = 0.17) -> None:
    r = min(r_frac * p.h, 0.1 * p.w)
    for u in us:
        p.disc(u, 1 - r / p.h, r, TYRE)
        p.disc(u, 1 - r / p.h, 0.45 * r, HUB)


def _draw_car(p: _Painter, variant: int, colour) -> None:
    body = [
        [(0, .55), (.05, .45), (.25, .42), (.35, .08), (.68, .08), (.8, .42), (.97, .47), (1, .58),
         (1, .84), (0, .84)],
        [(0, .35), (.06, .1), (.6, .1), (.78, .42), (.97, .47), (1, .58), (1, .84), (0, .84)],
        [(0, .3), (.03, .06), (.66, .06), (.78, .38), (.97, .42), (1, .55), (1, .84), (0, .84)],
        [(0, .04), (.8, .04), (.93, .35), (1, .45), (1, .86), (0, .86)],
    ][variant]
    windows = [
        [[(.37, .14), (.5, .14), (.5, .4), (.28, .4)], [(.52, .14), (.66, .14), (.76, .4), (.52, .4)]],
        [[(.08, .16), (.3, .16), (.3, .4), (.04, .4)], [(.32, .16), (.58, .16), (.74, .4), (.32, .4)]],
        [[(.05, .12), (.32, .12), (.32, .36), (.03, .36)], [(.34, .12), (.64, .12), (.74, .36), (.34, .36)]],
        [[(.55, .1), (.8, .1), (.9, .34), (.55, .34)]],
    ][variant]
    p.poly(body, colour)
    for w in windows:
        p.poly(w, WINDOW)
    p.box(0, .76, 1, .84, tuple(0.55 * c for c in colour))
    p.box(.96, .5, 1, .6, HEADLAMP)
    p.box(0, .5, .03, .6, TAIL_LAMP)
    _wheels(p, (.2, .8) if variant != 1 else (.18, .82))


def _draw_truck(p: _Painter, variant: int, colour) -> None:
    cab_u = .75 if variant == 0 else .82
    cab = (70, 72, 80) if colour[0] > 220 else (236, 236, 232)
    p.box(0, 0, cab_u - .02, .82, colour)
    p.box(cab_u - .02, .76, cab_u, .86, TYRE)
    p.poly([(cab_u, .28), (.93, .28), (1, .5), (1, .86), (cab_u, .86)], cab)
    p.poly([(cab_u + .04, .33), (.92, .33), (.97, .5), (cab_u + .04, .5)], WINDOW)
    p.box(0, .82, 1, .9, (50, 50, 54))
    p.box(.97, .6, 1, .68, HEADLAMP)
    p.box(0, .7, .02, .78, TAIL_LAMP)
    _wheels(p, (.12, .27, .87) if variant == 0 else (.07, .15, .23, .7, .9), r_frac=.14)


def _draw_bus(p: _Painter, variant: int, colour) -> None:
    p.poly([(0, .06), (.02, .02), (.98, .02), (1, .08), (1, .88), (0, .88)], colour)
    p.box(.03, .12, .97, .46, WINDOW)
    for u in np.arange(.03, .97, .09 if variant == 0 else .075):
        p.box(u, .12, u + .012, .46, colour)
    p.box(0, .56, 1, .61, (240, 240, 236) if colour[2] < 150 else (40, 40, 44))
    p.box(.86, .14, .93, .86, (60, 66, 78))
    p.box(.975, .66, 1, .74, HEADLAMP)
    p.box(0, .66, .02, .74, TAIL_LAMP)
    _wheels(p, (.15, .8) if variant == 0 else (.12, .48, .86), r_frac=.13)


def _draw_person(p: _Painter, colour: int, pose: int) -> None:
    skin, shirt, trousers = SKINS[colour % 3], SHIRTS[colour % 8], TROUSERS[colour // 8]
    if pose == 0:
        p.box(.25, .54, .75, 1, trousers)
    else:
        p.poly([(.28, .54), (.52, .54), (.32, 1), (0, 1)], trousers)
        p.poly([(.48, .54), (.72, .54), (1, 1), (.68, 1)], trousers)
    p.poly([(.12, .2), (.88, .2), (.82, .58), (.18, .58)], shirt)
    p.disc(.5, .1, 0.1 * p.h, skin)


def _sprite(code: int, pose: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    kind, variant, colour, row, direction = decode_sprite_code(code)
    w, h = (int(x) for x in pixel_size(kind, variant, row, width, height))
    p = _Painter(w, h)
    if kind == CAR:
        _draw_car(p, variant, CAR_COLOURS[colour])
    elif kind == TRUCK:
        _draw_truck(p, variant, TRUCK_COLOURS[colour])
    elif kind == BUS:
        _draw_bus(p, variant, BUS_COLOURS[colour])
    else:
        _draw_person(p, colour, pose)
    return p.done(direction)


def _glow(w: int, h: int, direction: int, dark: float) -> tuple[np.ndarray, int]:
    """Additive headlight image for a vehicle box (h, w): lamps plus a beam on the road
    ahead; returns it and its x offset relative to the box."""
    beam = max(2, int(0.7 * w))
    g = np.zeros((h, w + beam, 3), np.float32)
    y0, y1 = int(0.45 * h), max(int(0.45 * h) + 1, int(0.65 * h))
    g[y0:y1, max(0, w - max(1, w // 25) - 1):w] = HEADLAMP
    g[y0:y1, 0:max(1, w // 30)] = TAIL_LAMP
    xs = np.arange(beam, dtype=np.float32) / beam
    ys = (np.arange(h, dtype=np.float32) + 0.5) / h
    spread = 0.1 + 0.45 * xs[None, :]
    centre = 0.55 + 0.4 * xs[None, :]
    cone = np.exp(-0.5 * ((ys[:, None] - centre) / spread) ** 2) * (1 - xs[None, :]) ** 1.5
    g[:, w:] = 70 * cone[..., None] * np.array([1.0, 0.97, 0.85], np.float32)
    out = np.clip(np.rint(g * dark), 0, 255).astype(np.uint8)
    if direction < 0:
        return np.ascontiguousarray(out[:, ::-1]), -beam
    return out, 0


class TrafficRenderer:
    """Renders frames of one scene; keeps per-light-level caches of backgrounds and sprites."""

    def __init__(self, scene):
        self.scene = scene
        self.W, self.H = scene.width, scene.height
        self.margin = int(np.ceil(2.5 * JITTER * max(self.W, self.H))) + 2
        self.base, self.lights = _street(scene.seed, self.W, self.H, self.margin)
        z = stream_rng(scene.seed, 21).standard_normal(
            (self.H + 2 * NOISE_PAD, self.W + 2 * NOISE_PAD, 3)).astype(np.float32)
        self.noise = [(np.clip(np.rint(s * z), 0, 255).astype(np.uint8),
                       np.clip(np.rint(-s * z), 0, 255).astype(np.uint8)) for s in NOISE_SIGMAS]
        self._backgrounds: dict[int, np.ndarray] = {}
        self._sprites: dict[int, dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = {}
        self._base_sprites: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._glows: dict[tuple[int, int, int, int], tuple[np.ndarray, int]] = {}
        self._codes = scene.objects.sprite_code
        self._kinds = scene.objects.kind

    def _background(self, level: int) -> np.ndarray:
        if level not in self._backgrounds:
            if len(self._backgrounds) >= CACHED_LEVELS:
                self._backgrounds.pop(next(iter(self._backgrounds)))
            lit = cv2.LUT(self.base, _tone_curve(level))
            dark = float(_darkness(_level_gain(level)))
            if dark > 0:
                lit = cv2.add(lit, cv2.convertScaleAbs(self.lights, alpha=dark))
            self._backgrounds[level] = lit
        return self._backgrounds[level]

    def _sprite(self, code: int, pose: int, level: int) -> tuple[np.ndarray, np.ndarray]:
        per_level = self._sprites.get(level)
        if per_level is None:
            if len(self._sprites) >= CACHED_LEVELS:
                self._sprites.pop(next(iter(self._sprites)))
            per_level = self._sprites[level] = {}
        key = (code, pose)
        hit = per_level.get(key)
        if hit is None:
            base = self._base_sprites.get(key)
            if base is None:
                base = self._base_sprites[key] = _sprite(code, pose, self.W, self.H)
            hit = per_level[key] = (cv2.LUT(base[0], _tone_curve(level)), base[1])
        return hit

    def _glow(self, w: int, h: int, direction: int, level: int) -> tuple[np.ndarray, int]:
        key = (w, h, direction, level)
        if key not in self._glows:
            if len(self._glows) > 4096:
                self._glows.clear()
            self._glows[key] = _glow(w, h, direction, float(_darkness(_level_gain(level))))
        return self._glows[key]

    def render(self, pl: Placements, f0: int, f1: int) -> Iterator[np.ndarray]:
        """Frames [f0, f1) given their placements; yields one reused RGB buffer."""
        W, H, m = self.W, self.H, self.margin
        tl = timeline(self.scene.seed, np.arange(f0, f1, dtype=np.float64))
        levels = np.clip(np.rint((tl.gain - GAIN_RANGE[0]) / (GAIN_RANGE[1] - GAIN_RANGE[0])
                                 * (LEVELS - 1)), 0, LEVELS - 1).astype(np.int64).tolist()
        jx, jy = self.scene.jitter_pixels(f0, f1)
        rng = stream_rng(self.scene.seed, 22, f0)
        offsets = rng.integers(0, 2 * NOISE_PAD + 1, size=(f1 - f0, 4)).tolist()
        bounds = np.searchsorted(pl.frame, np.arange(f0, f1 + 1)).tolist()
        codes = self._codes[pl.obj].tolist()
        kinds = self._kinds[pl.obj].tolist()
        walking = pl.moving & (self._kinds[pl.obj] == PERSON)
        pose = np.where(walking, (pl.frame // 6 + pl.obj) % 2, 0).tolist()  # legs apart or not
        x1s, y1s = pl.x1.tolist(), pl.y1.tolist()
        frame = np.empty((H, W, 3), np.uint8)
        for k in range(f1 - f0):
            level = levels[k]
            dark = _darkness(_level_gain(level)) > 0
            bg = self._background(level)
            np.copyto(frame, bg[m + jy[k]:m + jy[k] + H, m + jx[k]:m + jx[k] + W])
            for r in range(bounds[k], bounds[k + 1]):
                rgb, mask = self._sprite(codes[r], pose[r], level)
                x, y = x1s[r], y1s[r]
                _paste(frame, rgb, mask, x, y)
                if dark and kinds[r] != PERSON:
                    h, w = mask.shape[:2]
                    glow, dx = self._glow(w, h, 1 if codes[r] % 2 else -1, level)
                    _add(frame, glow, x + dx, y)
            pos, neg = self.noise[min(int(_darkness(_level_gain(level)) * len(NOISE_SIGMAS)),
                                      len(NOISE_SIGMAS) - 1)]
            a, b, c, d = offsets[k]
            cv2.add(frame, pos[a:a + H, b:b + W], dst=frame)
            cv2.subtract(frame, neg[c:c + H, d:d + W], dst=frame)
            yield frame


def _clip_box(frame: np.ndarray, h: int, w: int, x: int, y: int):
    H, W = frame.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, W), min(y + h, H)
    if x0 >= x1 or y0 >= y1:
        return None
    return (slice(y0, y1), slice(x0, x1)), (slice(y0 - y, y1 - y), slice(x0 - x, x1 - x))


def _paste(frame, rgb, mask, x, y) -> None:
    box = _clip_box(frame, rgb.shape[0], rgb.shape[1], x, y)
    if box is not None:
        np.copyto(frame[box[0]], rgb[box[1]], where=mask[box[1]])


def _add(frame, img, x, y) -> None:
    box = _clip_box(frame, img.shape[0], img.shape[1], x, y)
    if box is not None:
        roi = frame[box[0]]
        cv2.add(roi, img[box[1]], dst=roi)


class _Canvas:
    """A W×H picture with margin m: day colours `img`, night lights `lights`, and X/Y to
    turn fractions of the picture into canvas pixels."""

    def __init__(self, W: int, H: int, m: int):
        self.W, self.H, self.m = W, H, m
        self.Hc, self.Wc = H + 2 * m, W + 2 * m
        self.img = np.zeros((self.Hc, self.Wc, 3), np.float32)
        self.lights = np.zeros((self.Hc, self.Wc, 3), np.float32)

    def X(self, u):
        return min(max(int(round(self.m + u * self.W)), 0), self.Wc)

    def Y(self, v):
        return min(max(int(round(self.m + v * self.H)), 0), self.Hc)


def _street(seed: int, W: int, H: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Static street (day colours) and its night lights, on a canvas with margin m."""
    rng = stream_rng(seed, 20)
    c = _Canvas(W, H, m)
    _buildings(c, rng)
    _road(c, rng)
    _lane_lines(c)
    _lamps(c)
    base = np.clip(np.rint(c.img), 0, 255).astype(np.uint8)
    return base, np.clip(np.rint(c.lights), 0, 255).astype(np.uint8)


def _buildings(c: _Canvas, rng) -> None:
    """Sky, a row of buildings with (some lit) windows, trees in front."""
    img, X, Y = c.img, c.X, c.Y
    sky = np.linspace(0, 1, Y(0.36))[:, None]
    img[:Y(0.36)] = ((1 - sky) * np.array([150, 185, 228]) + sky * np.array([205, 216, 230]))[:, None, :]
    u = -0.05
    while u < 1.05:
        bw = rng.uniform(0.06, 0.16)
        top = rng.uniform(0.02, 0.22)
        colour = np.array([(150, 80, 60), (205, 190, 160), (140, 140, 145), (180, 170, 150),
                           (110, 100, 95)][rng.integers(5)]) * rng.uniform(0.85, 1.1)
        img[Y(top):Y(0.36), X(u):X(u + bw)] = colour
        for wy in np.arange(top + 0.025, 0.33, 0.045):
            for wx in np.arange(u + 0.012, u + bw - 0.02, 0.025):
                img[Y(wy):Y(wy + 0.022), X(wx):X(wx + 0.011)] = (62, 72, 88)
                if rng.uniform() < 0.45:
                    c.lights[Y(wy):Y(wy + 0.022), X(wx):X(wx + 0.011)] = (210, 170, 90)
        u += bw
    for tu in rng.uniform(0.05, 0.95, 4):  # trees in front of the buildings
        cv2.rectangle(img, (X(tu - 0.004), Y(0.27)), (X(tu + 0.004), Y(0.37)), (70, 55, 40), -1)
        cv2.ellipse(img, (X(tu), Y(0.24)), (max(2, int(0.035 * c.W)), max(2, int(0.06 * c.H))),
                    0, 0, 360, (60, 110, 55), -1)


def _road(c: _Canvas, rng) -> None:
    """Pavements, kerbs and the road surface with its patches."""
    img, X, Y, W, H = c.img, c.X, c.Y, c.W, c.H
    img[Y(0.36):Y(0.42)] = (166, 161, 152)
    for pu in np.arange(0, 1.05, 0.05):
        img[Y(0.36):Y(0.42), X(pu):X(pu) + max(1, W // 320)] = (140, 136, 128)
    img[Y(0.415):Y(0.425)] = (122, 122, 116)
    road = img[Y(0.425):Y(0.95)]
    road[:] = 88 + rng.normal(0, 4, road.shape[:2])[..., None]
    for _ in range(12):  # patches and stains
        cv2.ellipse(img, (X(rng.uniform()), Y(rng.uniform(0.45, 0.93))),
                    (max(1, int(rng.uniform(0.01, 0.05) * W)), max(1, int(0.01 * H))), 0, 0, 360,
                    (76, 76, 80), -1)
    img[Y(0.95):Y(0.958)] = (122, 122, 116)
    img[Y(0.958):] = (170, 165, 155)


def _lane_lines(c: _Canvas) -> None:
    """Dashed lane lines, a double yellow median where the directions part, edge lines."""
    img, X, Y = c.img, c.X, c.Y

    def line(v, colour, dashed, double=False):
        s = 0.2 + 0.88 * v
        thick = max(1, int(round(0.006 * c.H * s)))
        step = 0.1 * s
        for du in np.arange(-0.05, 1.05, step if dashed else 1.2):
            end = du + (step / 2 if dashed else 1.2)
            for off in ((-thick, thick) if double else (0,)):
                img[Y(v) + off:Y(v) + off + thick, X(du):X(end)] = colour

    for g0, g1 in pairwise(ROW_GROUND[FIRST_LANE_ROW:FIRST_LANE_ROW + len(LANES)]):
        median = LANES[0][1] != LANES[-1][1] and g0 == ROW_GROUND[FIRST_LANE_ROW + 2]
        line((g0 + g1) / 2 + 0.01, (220, 190, 60) if median else (225, 225, 220), not median,
             double=median)
    line(0.432, (225, 225, 220), False)
    line(0.942, (225, 225, 220), False)


def _lamps(c: _Canvas) -> None:
    """Street lamps (day) and their heads and light pools (night)."""
    img, X, Y, W, H = c.img, c.X, c.Y, c.W, c.H
    for lu in (0.15, 0.5, 0.85):
        pole = max(1, int(0.005 * W))
        img[Y(0.12):Y(0.41), X(lu):X(lu) + pole] = (60, 62, 66)
        img[Y(0.12):Y(0.12) + pole, X(lu):X(lu + 0.04)] = (60, 62, 66)
        head = (slice(Y(0.12), Y(0.135)), slice(X(lu + 0.025), X(lu + 0.05)))
        img[head] = (90, 90, 90)
        c.lights[head] = (255, 235, 170)
        pool = np.zeros((c.Hc, c.Wc), np.float32)
        cv2.ellipse(pool, (X(lu + 0.037), Y(0.44)), (max(2, int(0.09 * W)), max(2, int(0.06 * H))),
                    0, 0, 360, 1.0, -1)
        pool = cv2.GaussianBlur(pool, (0, 0), max(1.0, 0.02 * W))
        c.lights += pool[..., None] * np.array([70, 60, 40], np.float32)
