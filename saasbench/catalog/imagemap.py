"""Image maps: run a task whose images this machine cannot pull, with local images in their place.

Real SaaSBench tasks name registry images (``postgres:16-alpine``,
``shadetocloak/task_<id>-app:baseline``). Trials never pull during a run, so where a registry is
unreachable a user substitutes images they have (imported, built, or pulled elsewhere and
``docker load``-ed). An image map is a YAML file::

    images:
      postgres:16-alpine: local/postgres:16            # same contract, another name
      "shadetocloak/task_*-app:*": saasbench/debian-python:bookworm   # glob patterns are allowed
      redis:7-alpine:                                   # a substitute that needs another start
        image: local/busybox:ci
        command: ["sh", "-c", "exec nc -lk -p 6379 -e cat"]
        healthcheck: {test: ["CMD-SHELL", "true"]}
        note: "stand-in: accepts connections only"

Sources, later wins: ``image-map.yaml`` in the task folder, ``environment.image_map`` in
``task.yaml`` (the same mapping inline), then the user's file (``$SAASBENCH_IMAGE_MAP``, else
``~/.config/saasbench/image-map.yaml``): the person who runs the trial knows their machine best.
An exact name wins over a pattern; among patterns the first listed wins.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from saasbench import settings
from saasbench.catalog.envspec import EnvSpec, HealthcheckSpec, SpecError
from saasbench.inputs import InputError, load_yaml

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task

TASK_MAP_FILE = "image-map.yaml"


class ImageSubstitute(BaseModel):
    """What runs instead of one named image; ``command``/``entrypoint``/``healthcheck`` replace the service's own."""

    model_config = ConfigDict(extra="forbid")

    image: str
    command: list[str] | str | None = None
    entrypoint: list[str] | str | None = None
    healthcheck: HealthcheckSpec | None = None
    note: str = Field(
        default="", description="Why this substitute is faithful (or how it is not); shown by `tasks images`"
    )


class ImageMap(BaseModel):
    """The file format of an image map (``images:`` name or glob -> image or :class:`ImageSubstitute`)."""

    model_config = ConfigDict(extra="forbid")

    images: dict[str, ImageSubstitute] = Field(default_factory=dict)

    @field_validator("images", mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): {"image": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    def lookup(self, image: str) -> ImageSubstitute | None:
        if image in self.images:
            return self.images[image]
        for pattern, sub in self.images.items():
            if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(image, pattern):
                return sub
        return None

    def merged(self, other: ImageMap) -> ImageMap:
        return ImageMap(images={**self.images, **other.images})


def user_map_path() -> Path:
    return settings.image_map_path()


def read_image_map(path: Path) -> ImageMap:
    """Parse one image-map file; :class:`SpecError` names the file and the bad entry."""
    try:
        raw = load_yaml(path, what="image map") or {}
    except InputError as exc:
        raise SpecError(str(exc)) from None
    return _validate(raw, str(path))


def _validate(raw: Any, where: str) -> ImageMap:
    if isinstance(raw, dict) and "images" not in raw:
        raw = {"images": raw}  # a bare mapping is accepted too
    try:
        return ImageMap.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def image_map_for(task: Task | None) -> ImageMap:
    """The effective map for ``task`` (task file < task.yaml ``environment.image_map`` < the user's file)."""
    result = ImageMap()
    if task is not None:
        if (task.root / TASK_MAP_FILE).is_file():
            result = result.merged(read_image_map(task.root / TASK_MAP_FILE))
        inline = (task.spec.environment or {}).get("image_map")
        if inline:
            result = result.merged(_validate(inline, f"{task.root / 'task.yaml'}: environment.image_map"))
    user = user_map_path()
    if user.is_file():
        result = result.merged(read_image_map(user))
    return result


def apply_image_map(spec: EnvSpec, mapping: ImageMap) -> EnvSpec:
    """A copy of ``spec`` with mapped images (and their overrides); ``substitutions`` records each swap."""
    if not mapping.images:
        return spec
    out = spec.model_copy(deep=True)
    for name, svc in out.services.items():
        if svc.image is None or svc.build is not None:
            continue
        sub = mapping.lookup(svc.image)
        if sub is None:
            continue
        out.substitutions[name] = f"{svc.image} -> {sub.image}" + (f" ({sub.note})" if sub.note else "")
        svc.image = sub.image
        for key in ("command", "entrypoint", "healthcheck"):
            if getattr(sub, key) is not None:
                setattr(svc, key, getattr(sub, key))
    return out


class ImageNeed(BaseModel):
    """One service's image, as ``tasks images`` reports it."""

    service: str
    declared: str = Field(description="The image the task names, or 'build: <context>'")
    image: str | None = Field(description="What would run (after the image map); None for a build")
    substitute: str | None = None
    available: bool | None = Field(description="Present in the engine; None when no engine was asked or it is a build")


def image_needs(spec: EnvSpec, client: Any | None = None) -> list[ImageNeed]:
    """Each service's image and whether the engine has it (``client`` a docker client, or None: not checked)."""
    out: list[ImageNeed] = []
    for name, svc in spec.services.items():
        if svc.build is not None:
            out.append(ImageNeed(service=name, declared=f"build: {svc.build.context}", image=None, available=None))
            continue
        available = None
        if client is not None:
            import docker.errors

            try:
                client.images.get(svc.image)
                available = True
            except docker.errors.ImageNotFound:
                available = False
        declared = spec.substitutions.get(name, "").split(" -> ")[0] or str(svc.image)
        out.append(
            ImageNeed(
                service=name,
                declared=declared,
                image=svc.image,
                substitute=spec.substitutions.get(name),
                available=available,
            )
        )
    return out
