#!/usr/bin/env python3
"""pydantic_models.py — ordinary structured-output models as users write them with pydantic
(bounded numbers, emails, dates, date-times, UUIDs, patterns, nested models, optional fields,
enums, unions, lists with lengths), for api_test.mjs. Prints a JSON list of {"name", "schema",
"bad"}: each schema is pydantic's own output (Model.schema()); `bad` is an instance that
breaks exactly one bound of the model, the negative control that the validator checks what
the grammar must enforce (pydantic itself refuses it too: checked here).

Debian 12's python3-pydantic is pydantic 1.10 (there is no v2 package): its schemas differ
from v2's in spelling only where v2 writes `$defs` and nullable `anyOf` (v1: `definitions`,
an optional field is simply not required). Run by tests/api/run.sh with /usr/bin/python3.
"""
import json
from datetime import date, datetime
from enum import Enum
from typing import Optional, Union
from uuid import UUID

from pydantic import BaseModel, EmailStr, ValidationError, confloat, conint, conlist, constr


class Person(BaseModel):
    name: constr(min_length=1, max_length=20)
    age: conint(ge=0, le=120)
    email: EmailStr


class Role(str, Enum):
    admin = "admin"
    user = "user"
    guest = "guest"


class Account(BaseModel):
    id: UUID
    role: Role


class Event(BaseModel):
    title: constr(max_length=30)
    day: date
    starts: datetime


class Rating(BaseModel):
    score: confloat(ge=0, le=10)
    comment: constr(max_length=40)


class Line(BaseModel):
    sku: constr(regex=r"^[A-Z]{3}-\d{3}$")
    qty: conint(ge=1, le=9)


class Order(BaseModel):
    lines: conlist(Line, min_items=1, max_items=3)
    total: confloat(ge=0, le=5000)


class Profile(BaseModel):
    nickname: Optional[constr(max_length=10)] = None
    age: Optional[conint(ge=0, le=150)] = None


class Product(BaseModel):
    price: confloat(gt=0, le=100000)
    quantity: conint(ge=0, le=999)
    tags: conlist(constr(max_length=8), min_items=1, max_items=3)


class Choice(BaseModel):
    value: Union[conint(ge=-5, le=5), constr(max_length=5)]


MODELS = [
    ("pydantic person", Person, {"name": "Ann", "age": 121, "email": "ann@example.com"}),
    ("pydantic account", Account, {"id": "123e4567-e89b-12d3-a456-42661417400", "role": "user"}),
    ("pydantic event", Event, {"title": "x", "day": "2024-02-30", "starts": "2024-01-01T10:00:00Z"}),
    ("pydantic rating", Rating, {"score": 10.5, "comment": ""}),
    ("pydantic order", Order, {"lines": [{"sku": "ABC-123", "qty": 0}], "total": 1}),
    ("pydantic profile", Profile, {"nickname": "x", "age": -1}),
    ("pydantic product", Product, {"price": 0, "quantity": 1, "tags": ["a"]}),
    ("pydantic choice", Choice, {"value": "toolong"}),
]

out = []
for name, model, bad in MODELS:
    try:
        model.parse_obj(bad)
        raise SystemExit(f"pydantic_models.py: {name}: pydantic accepts the bad instance {bad}")
    except ValidationError:
        pass
    out.append({"name": name, "schema": model.schema(), "bad": bad})
print(json.dumps(out))
