//! What every controller here shares around its reconcile: one context
//! built once per process ([`Shared`]: the client, the policy, the metrics,
//! the clock and the Event recorder), what the watch caches keep of an
//! object ([`slim`]), and one [`error_policy`] (logged, counted under the
//! controller's label, retried after [`ERROR_RECHECK`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, Recorder, Reporter};
use trainwire_policyfile::SharedPolicy;

use crate::error::Error;
use crate::metrics::{Controller, Metrics};

/// Back-off after a failed reconcile, whichever the controller.
pub const ERROR_RECHECK: Duration = Duration::from_secs(10);

/// The time, as the controllers read it (a fake one in tests).
pub type Clock = Box<dyn Fn() -> Timestamp + Send + Sync>;

/// What every controller's context holds, built once in the process and
/// shared: a controller cannot be started with metrics of its own, so its
/// failed reconciles are counted on the served `/metrics`.
pub struct Shared {
    pub client: kube::Client,
    pub policy: SharedPolicy,
    pub metrics: Arc<Metrics>,
    clock: Clock,
    recorder: Recorder,
}

impl Shared {
    pub fn new(
        client: kube::Client,
        policy: SharedPolicy,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            recorder: recorder(client.clone()),
            client,
            policy,
            metrics,
            clock,
        })
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// Publish an Event on `regarding`. A failure to publish is logged,
    /// never fails the reconcile.
    pub async fn publish(&self, event: Event, regarding: &ObjectReference) {
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason = %event.reason, "could not publish an Event");
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// A controller's context: which controller it is (the label of its failed
/// reconciles) and the [`Shared`] part.
pub trait Reconciler {
    const CONTROLLER: Controller;
    fn shared(&self) -> &Shared;
}

/// Drop what no reader of a watch cache needs ([`trainwire_engine::cache::slim`]).
pub fn slim<K: Resource>(object: &mut K) {
    trainwire_engine::cache::slim(object.meta_mut());
}

/// After a failed reconcile of `object`: log the error, count it in
/// `trainwire_webhook_reconcile_errors_total` under the context's
/// controller, look again after [`ERROR_RECHECK`].
pub fn error_policy<K: Resource, C: Reconciler>(
    object: Arc<K>,
    error: &Error,
    ctx: Arc<C>,
) -> Action {
    tracing::warn!(
        controller = ?C::CONTROLLER,
        namespace = object.meta().namespace.as_deref().unwrap_or_default(),
        name = object.meta().name.as_deref().unwrap_or_default(),
        error = %error,
        "reconcile failed; retrying"
    );
    ctx.shared().metrics.reconcile_failed(C::CONTROLLER);
    Action::requeue(ERROR_RECHECK)
}

/// The Event recorder of the controllers: reported as `trainwire-webhook`
/// (the name Events have always carried), the instance being the pod's name.
fn recorder(client: kube::Client) -> Recorder {
    let reporter = Reporter {
        controller: "trainwire-webhook".to_string(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    Recorder::new(client, reporter)
}
