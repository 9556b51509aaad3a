"""A prepared INSERT and a prepared one-row SELECT for the hot paths: the ORM compiles each
statement once and the instance is built as the ORM builds it (anex/internals: these lean
on the ORM's compiler and its related-object populators, private to Django)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import InsertQuery

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Compiled:
    fields: list[Any]
    statement: str
    returning: list[Any]
    returning_params: tuple[Any, ...]
    converters: list[tuple[int, tuple[list[Any], Any]]]


class PreparedInsert(Generic[M]):
    """`Model.objects.create(**values)` for an INSERT on a hot path, its SQL compiled by the
    ORM on first use and kept: the same statement, each field's value as the ORM prepares
    it (pre_save, then get_db_prep_save), the same pre_save and post_save signals, the
    instance saved and returned alike, only without compiling the INSERT again on every
    call (a tenth of a realtime request's CPU). For a model with no parent model (the ORM
    saves those in several statements)."""

    def __init__(self, model: type[M]) -> None:
        if model._meta.parents:
            raise TypeError(f"{model.__name__} has a parent model: use objects.create()")
        self.model = model
        self._compiled: _Compiled | None = None
        self._lock = threading.Lock()

    def _compile(self, instance: M) -> _Compiled:
        with self._lock:
            if self._compiled is None:
                meta = self.model._meta
                fields = [field for field in meta.local_concrete_fields
                          if not field.generated and field is not meta.auto_field]
                returning = list(meta.db_returning_fields)
                query = InsertQuery(self.model)
                query.insert_values(fields, [instance])
                compiler = query.get_compiler(using=DEFAULT_DB_ALIAS)
                compiler.returning_fields = returning
                ((statement, params),) = compiler.as_sql()
                returning_params = tuple(compiler.returning_params)
                if len(params) != len(fields) + len(returning_params):
                    raise TypeError(f"{self.model.__name__}'s INSERT does not take one "
                                    "parameter a field")
                converters = compiler.get_converters(
                    [field.get_col(meta.db_table) for field in returning])
                self._compiled = _Compiled(fields, statement, returning, returning_params,
                                           list(converters.items()))
            return self._compiled

    def create(self, **values: Any) -> M:
        instance = self.model(**values)
        # As save() does: a related instance must be saved, and gives its id.
        instance._prepare_related_fields_for_save(  # type: ignore[attr-defined]
            operation_name="save")
        compiled = self._compiled or self._compile(instance)
        connection = connections[DEFAULT_DB_ALIAS]
        pre_save.send(sender=self.model, instance=instance, raw=False, using=DEFAULT_DB_ALIAS,
                      update_fields=None)
        params = [field.get_db_prep_save(field.pre_save(instance, True), connection)
                  for field in compiled.fields]
        with transaction.mark_for_rollback_on_error(DEFAULT_DB_ALIAS), \
                connection.cursor() as cursor:
            cursor.execute(compiled.statement, [*params, *compiled.returning_params])
            row = list(connection.ops.fetch_returned_insert_columns(
                cursor, compiled.returning_params))
        for pos, (converters, expression) in compiled.converters:
            for converter in converters:
                row[pos] = converter(row[pos], expression, connection)
        for value, field in zip(row, compiled.returning, strict=True):
            setattr(instance, field.attname, value)
        instance._state.db = DEFAULT_DB_ALIAS
        instance._state.adding = False
        post_save.send(sender=self.model, instance=instance, created=True, update_fields=None,
                       raw=False, using=DEFAULT_DB_ALIAS)
        return instance  # type: ignore[return-value]


@dataclass(frozen=True)
class _CompiledSelect:
    model: type[Model]
    sql: str
    params: tuple[Any, ...]  # the SQL's parameters: the constants the query built in ...
    order: tuple[int | None, ...]  # ... and, where a sentinel went, which of the call's values
    converters: tuple[tuple[int, tuple[Any, ...], Any], ...]
    fields: slice
    names: tuple[str, ...]
    annotations: tuple[tuple[str, int], ...]
    populators: tuple[Any, ...]


class PreparedSelect(Generic[M]):
    """`build(*values).first()` for a query on a hot path that finds one row or none (by a
    unique column), its SQL compiled by the ORM on first use and kept: the same statement,
    the same conversions of its columns, the same instance (with its select_related objects
    and its annotations) built as the ORM's ModelIterable builds it, only without compiling
    the query again on every call (the compiling was a fifth of a job read's CPU, a tenth
    of a realtime request's). `build` makes the queryset from its values; it is compiled
    once with `sentinels` in their place (one distinct value for each, of the type the ORM
    sends for its column: a UUID for a UUID column), and each call's `values` go where
    those went."""

    def __init__(self, build: Callable[..., QuerySet[M]], *, sentinels: tuple[Any, ...]) -> None:
        if len(set(sentinels)) != len(sentinels):
            raise ValueError("each sentinel must be distinct")
        self.build = build
        self.sentinels = sentinels
        self._compiled: _CompiledSelect | None = None
        self._lock = threading.Lock()

    def _compile(self) -> _CompiledSelect:
        with self._lock:
            if self._compiled is None:
                queryset = self.build(*self.sentinels)
                compiler = queryset.query.get_compiler(using=DEFAULT_DB_ALIAS)
                sql, params = compiler.as_sql()
                order = tuple(self.sentinels.index(param) if param in self.sentinels
                              else None for param in params)
                if sorted(index for index in order if index is not None) \
                        != list(range(len(self.sentinels))):
                    raise TypeError(f"the query does not take each sentinel once: {params}")
                select, klass_info = compiler.select, compiler.klass_info
                assert klass_info is not None
                fields = klass_info["select_fields"]
                converters = compiler.get_converters([column[0] for column in select])
                self._compiled = _CompiledSelect(
                    model=queryset.model, sql=sql, params=tuple(params), order=order,
                    converters=tuple((pos, tuple(convs), expression)
                                     for pos, (convs, expression) in converters.items()),
                    fields=slice(fields[0], fields[-1] + 1),
                    names=tuple(column[0].target.attname
                                for column in select[fields[0]:fields[-1] + 1]),
                    annotations=tuple(compiler.annotation_col_map.items()),
                    populators=tuple(get_related_populators(klass_info, select,
                                                            DEFAULT_DB_ALIAS)))
            return self._compiled

    def first(self, *values: Any) -> M | None:
        compiled = self._compiled or self._compile()
        connection = connections[DEFAULT_DB_ALIAS]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, [param if index is None else values[index] for param,
                                          index in zip(compiled.params, compiled.order,
                                                       strict=True)])
            fetched = cursor.fetchone()
        if fetched is None:
            return None
        row = list(fetched)
        for pos, convs, expression in compiled.converters:
            value = row[pos]
            for converter in convs:
                value = converter(value, expression, connection)
            row[pos] = value
        instance = compiled.model.from_db(DEFAULT_DB_ALIAS, list(compiled.names),
                                          row[compiled.fields])
        for populator in compiled.populators:
            populator.populate(row, instance)
        for name, pos in compiled.annotations:
            setattr(instance, name, row[pos])
        return instance  # type: ignore[return-value]
