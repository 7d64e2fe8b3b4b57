"""A fake Kubernetes API server for the operator tests, served over real HTTP with watch streams.

Why not kmock: kmock (0.8) serves canned or stored objects, but it lacks almost every property
the operator's correctness depends on: resourceVersion / uid / generation / creationTimestamp,
watches resumed from a resourceVersion, PUT, the status-subresource split, label selectors,
garbage collection, finalizers and schema validation. Adding them means replacing its object
store and request handlers (its extension points are in `kmock._internal`), so this package is a
small aiohttp server written for the project instead; kopf and the `kubernetes` client talk to it
exactly as to a real apiserver (discovery, JSON over HTTP, chunked watch streams).

What it does as a real apiserver does:
- one cluster-wide, monotonically increasing resourceVersion; uid, creationTimestamp, generation
  set on create; generation bumped only when something outside metadata and status changes;
  no-op writes bump nothing and emit no event;
- the namespace comes from the URL (a mismatching body namespace is 400; a missing namespace 404);
  `generateName`; 409 AlreadyExists; 404 NotFound with the apiserver's `Status` body;
- discovery (/api, /apis, group versions, `plural/status` and `plural/scale` entries) including
  resources added by creating a CustomResourceDefinition;
- list with label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors
  (metadata.name, metadata.namespace, status.phase); list resourceVersion;
- watch (`watch=true|1|True`) from a resourceVersion, from "now" with synthetic ADDED events, with
  `timeoutSeconds`, `sendInitialEvents` bookmarks, and 410 Gone after `Store.compact()`; with a
  selector, an object that starts matching arrives as ADDED and one that stops as DELETED;
- PUT and PATCH (merge, JSON patch with `test`; strategic merge treated as merge) with
  resourceVersion preconditions (409 Conflict, the apiserver's message); a failed JSON-patch test
  is 422 (kopf relies on that);
- status subresource split: writes to the main resource ignore `status`, writes to `/status`
  change only `status`; CRs lose `status` on create; scale subresource from the CRD's paths;
- DELETE with uid / resourceVersion preconditions; finalizers (deletionTimestamp set, removal
  when the last finalizer goes, no new finalizers while deleting); `propagationPolicy: Orphan`;
- ownerReference garbage collection, background propagation, asynchronous like the real
  collector; dependents whose owners are all gone are deleted;
- CRD structural-schema and CEL validation on create and update through `tlt.spec.crd_validate`:
  defaults applied and unknown fields pruned, or refused with 400 under `fieldValidation=Strict`;
  invalid objects answered with 422 `Invalid` and the apiserver's message shape (`<Kind>.<group> "<name>" is
  invalid: <field>: <message>`) and causes.

What it does not do:
- no scheduler or kubelet: pods stay `Pending` until a test writes their status (see
  `kubelet.py`); deleted pods vanish at once (no graceful termination);
- no server-side apply (415), no strategic-merge list semantics, no defaulting or pruning of
  built-in kinds, no validation of built-in kinds (tests check those against the client's models);
- no pagination (`limit` / `continue` ignored), no field managers, no admission webhooks, no
  RBAC or authentication (any token is accepted), no foreground deletion (treated as background);
- list items carry kind and apiVersion (a real server leaves them out for built-in kinds).
Faults (status codes, delays that time clients out) are injected per method and path: `Faults`.
"""

from .api_types import ApiError
from .fake import FakeKube
from .server import Faults
from .store import Store

__all__ = ["ApiError", "FakeKube", "Faults", "Store"]
