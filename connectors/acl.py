"""Who may read and write which topic of the ledger: the ACL model `ledger acl apply` sets on a cluster.

Roles (docs/security.md explains each grant):

- workers read commands, the changelog and snapshots, and write every output (results, each client's own
  results topic, history, balances, dead letters, follow-up commands), the changelog and snapshots, through transactional ids
  `<prefix>ledger-p<partition>` (streams/engine.py) in the consumer groups `<prefix>workers` (Faust) and
  `<prefix>restore` (the engine's changelog reader);
- producers write commands and read only their own results topic, `<prefix>results.<client id>`, which the
  workers fill with a copy of every result of that client (streams/engine.py; Settings.client_results_topic names it);
- readers read balances and history (the read API, the projector, rebuild-balances, replay);
- auditors read every ledger topic and write none (`ledger verify`, `ledger tail`).

Nobody else writes an output: the broker denies whatever no ACL allows (allow.everyone.if.no.acl.found=false
on the secured broker of scripts/kafka.sh). Consumer groups are granted by prefix per role and never the
workers' group to anyone else: a stranger joining it would be handed commands partitions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from streams.config import TOPIC_NAMES, Settings
from streams.engine import TRANSACTIONAL_ID_STEM

READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED

# What workers read: commands, and their own redo log and state snapshots at a restore (streams/engine.py).
# They write every ledger topic (TOPIC_NAMES): outputs, follow-up commands, changelog and snapshots.
WORKER_READS = ("commands", "changelog", "snapshots")
# Consumer group name stems each role's processes use (a random suffix follows): they read by assign() and
# commit nothing, but librdkafka still looks up a coordinator for the group, which needs the grant.
PRODUCER_GROUPS = ("client-",)  # connectors/client.py
READER_GROUPS = ("reader-", "projector-", "replay-", "rb-")  # projections/{topics,projector,replay,bulk}.py
AUDITOR_GROUPS = ("quiescent-", "tail-", "raw-", "ends-", "verify-")  # projections/verify.py, connectors/cli.py


@dataclass(frozen=True, slots=True)
class Grant:
    """One allowed operation: `principal` may `operation` the `resource` named `name` (exactly, or every name
    starting with it when `pattern` is PREFIXED), from any host."""
    principal: str  # "User:<name>"
    resource: ResourceType
    name: str
    pattern: ResourcePatternType
    operation: AclOperation

    def binding(self) -> AclBinding:
        return AclBinding(self.resource, self.name, self.pattern, self.principal, "*", self.operation,
                          AclPermissionType.ALLOW)

    def __str__(self) -> str:
        star = "*" if self.pattern == PREFIXED else ""
        return f"{self.principal:20} {self.operation.name:16} {self.resource.name.lower():16} {self.name}{star}"


@dataclass(frozen=True)
class Roles:
    """Principals by role. A producer is `principal` or `principal:client_id[,client_id...]` when the client
    ids it sends under differ from its principal's name."""
    workers: tuple[str, ...] = ()
    producers: tuple[str, ...] = ()
    readers: tuple[str, ...] = ()
    auditors: tuple[str, ...] = ()
    client_ids: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, workers, producers, readers, auditors) -> "Roles":
        names, ids = [], {}
        for spec in producers:
            principal, _, clients = spec.partition(":")
            names.append(principal)
            ids[principal] = tuple(c for c in clients.split(",") if c) or (principal,)
        return cls(tuple(workers), tuple(names), tuple(readers), tuple(auditors), ids)

    def clients(self) -> list[str]:
        return sorted({c for p in self.producers for c in self.client_ids.get(p, (p,))})


def _topic_grants(principal: str, names, operations, pattern=LITERAL) -> list[Grant]:
    return [Grant(principal, TOPIC, n, pattern, op) for n in names for op in operations]


def _group_grants(principal: str, stems, pattern=PREFIXED) -> list[Grant]:
    return [Grant(principal, GROUP, s, pattern, READ) for s in stems]


def model(settings: Settings, roles: Roles) -> list[Grant]:
    """Every grant of the model, in a stable order."""
    t = settings.topic
    grants: list[Grant] = []
    for name in roles.workers:
        p = f"User:{name}"
        grants += _topic_grants(p, [t(n) for n in WORKER_READS], [READ, DESCRIBE])
        grants += _topic_grants(p, [t(n) for n in TOPIC_NAMES], [WRITE, DESCRIBE])  # every output, its own logs
        # Each client's own results topic, present and future: workers write them, nobody else does.
        grants += _topic_grants(p, [settings.client_results_topic("")], [WRITE, DESCRIBE], PREFIXED)
        # The worker checks the topics' max.message.bytes before it starts (streams/app.py).
        grants += _topic_grants(p, [settings.prefix], [AclOperation.DESCRIBE_CONFIGS], PREFIXED)
        # Faust's own assignor topic `<prefix>workers-__assignor-__leader`, which it subscribes to.
        grants += _topic_grants(p, [f"{settings.prefix}workers-"], [READ, DESCRIBE], PREFIXED)
        grants += _group_grants(p, [f"{settings.prefix}workers", f"{settings.prefix}restore"], LITERAL)
        grants += [Grant(p, TXN, f"{settings.prefix}{TRANSACTIONAL_ID_STEM}", PREFIXED, op) for op in (WRITE, DESCRIBE)]
    for name in roles.producers:
        p = f"User:{name}"
        grants += _topic_grants(p, [t("commands")], [WRITE, DESCRIBE])
        grants += _topic_grants(p, [settings.client_results_topic(c) for c in roles.client_ids.get(name, (name,))],
                                [READ, DESCRIBE])
        grants += _group_grants(p, PRODUCER_GROUPS)
    for name in roles.readers:
        p = f"User:{name}"
        grants += _topic_grants(p, [t("balances"), t("history")], [READ, DESCRIBE])
        grants += _group_grants(p, READER_GROUPS)
    for name in roles.auditors:
        p = f"User:{name}"
        grants += _topic_grants(p, [settings.prefix], [READ, DESCRIBE], PREFIXED)
        grants += _group_grants(p, AUDITOR_GROUPS + READER_GROUPS)
        # verify waits for quiescence by the workers' committed offsets: DESCRIBE reads them, joining needs READ.
        grants.append(Grant(p, GROUP, f"{settings.prefix}workers", LITERAL, DESCRIBE))
    return list(dict.fromkeys(grants))  # a DESCRIBE both reading and writing roles need, once


def _is_ledger_resource(settings: Settings, binding: AclBinding, roles: Roles) -> bool:
    if binding.restype == TOPIC:
        return binding.name.startswith(settings.prefix)
    if binding.restype == TXN:
        return binding.name.startswith(settings.prefix)
    if binding.restype == GROUP:
        stems = (settings.prefix,) + PRODUCER_GROUPS + READER_GROUPS + AUDITOR_GROUPS
        return binding.name.startswith(stems)
    return False


def _key(b: AclBinding) -> tuple:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


@dataclass
class Applied:
    created: list[Grant]
    kept: list[Grant]
    removed: list[str]


def apply(settings: Settings, roles: Roles, admin: AdminClient, prune: bool = False) -> Applied:
    """Create every grant of the model that the cluster lacks (idempotent). With prune, delete the ALLOW
    bindings on the ledger's own resources (its prefix, its group stems) that the model does not hold."""
    wanted = model(settings, roles)
    existing = {_key(b): b for b in _describe_all(admin)}
    missing = [g for g in wanted if _key(g.binding()) not in existing]
    kept = [g for g in wanted if _key(g.binding()) in existing]
    if missing:
        for future in admin.create_acls([g.binding() for g in missing], request_timeout=30).values():
            future.result()
    removed: list[str] = []
    if prune:
        wanted_keys = {_key(g.binding()) for g in wanted}
        stale = [b for k, b in existing.items() if k not in wanted_keys and _is_ledger_resource(settings, b, roles)
                 and b.permission_type == AclPermissionType.ALLOW]
        if stale:
            filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                        b.operation, b.permission_type) for b in stale]
            for future in admin.delete_acls(filters, request_timeout=30).values():
                future.result()
            removed = [f"{b.principal} {b.operation.name} {b.restype.name.lower()} {b.name}" for b in stale]
    return Applied(missing, kept, removed)


def _describe_all(admin: AdminClient) -> list[AclBinding]:
    any_filter = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    try:
        return admin.describe_acls(any_filter, request_timeout=30).result()
    except KafkaException as exc:
        if exc.args[0].name() == "SECURITY_DISABLED":
            raise AclsUnsupported("the cluster has no authorizer (ACLs are off): nothing to apply") from None
        raise


class AclsUnsupported(RuntimeError):
    pass


def create_client_results_topics(settings: Settings, clients: list[str], admin: AdminClient) -> list[str]:
    """Each producing client's own results topic, configured like the shared results topic; returns those
    created now. The workers copy a client's results there once they see the topic (streams/engine.py)."""
    from connectors.admin import TOPIC_CONFIGS, new_topic

    present = set(admin.list_topics(timeout=10).topics)
    wanted = [settings.client_results_topic(c) for c in clients]
    missing = [n for n in wanted if n not in present]
    if missing:
        futures = admin.create_topics([new_topic(settings, admin, n, TOPIC_CONFIGS["results"]) for n in missing],
                                      operation_timeout=30)
        for future in futures.values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
    return missing
