//! What every controller here shares around its reconcile: what the watch
//! caches keep of an object ([`slim`]), what happens after a failed
//! reconcile ([`retry_after_error`]: logged, counted, retried after a
//! back-off), and the Event recorder ([`recorder`]).

use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};

use crate::metrics::{Controller, Metrics};

/// Drop what no reader of a watch cache needs ([`trainwire_engine::cache::slim`]).
pub fn slim<K: Resource>(object: &mut K) {
    trainwire_engine::cache::slim(object.meta_mut());
}

/// After a failed reconcile of `object` by `controller`: log the error,
/// count it in `trainwire_webhook_reconcile_errors_total`, look again after
/// `back_off`.
pub fn retry_after_error<K: Resource>(
    controller: Controller,
    object: &K,
    error: &dyn std::fmt::Display,
    metrics: &Metrics,
    back_off: Duration,
) -> Action {
    tracing::warn!(
        controller = ?controller,
        namespace = object.meta().namespace.as_deref().unwrap_or_default(),
        name = object.meta().name.as_deref().unwrap_or_default(),
        error = %error,
        "reconcile failed; retrying"
    );
    metrics.reconcile_failed(controller);
    Action::requeue(back_off)
}

/// The Event recorder of the controllers: reported as `trainwire-webhook`
/// (the name Events have always carried), the instance being the pod's name.
pub fn recorder(client: kube::Client) -> Recorder {
    let reporter = Reporter {
        controller: "trainwire-webhook".to_string(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    Recorder::new(client, reporter)
}
