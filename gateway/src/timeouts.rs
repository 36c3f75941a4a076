//! One timer per connection for the gateway's three timeouts: a request's
//! headers (hyper's header read timeout), the deadline of a request in
//! flight, and each part of its body.
//!
//! Each of them as its own tokio timer cost every request a registration
//! and a cancellation in tokio's timer wheel, which sits behind one lock
//! for the whole process: under load the two worker threads queued on it
//! (`sched_yield` in the lock's slow path), and a body timer, earlier than
//! any other, woke the I/O driver each time (an `eventfd` write). In the
//! edge benchmark's join that was about a sixth of the gateway's CPU per
//! request (BENCHMARKS.md); the status poll, with no body, moved less.
//!
//! A [`Clock`] keeps one tokio timer and moves it lazily: a new deadline
//! later than the one armed is only remembered; when the armed one passes,
//! the clock re-arms for the deadline being waited for, or answers that it
//! passed. A connection's requests come one after another (HTTP/1), and
//! each wait ends long before its deadline, so the timer is re-armed about
//! once per timeout, not once per request, and never contended: only the
//! connection's own task polls it. The deadlines still fire on time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A connection's timer (see the module's documentation). Cloning shares it.
/// It wakes the task that last waited on it, so one task only may wait on
/// it: the connection's, which hyper polls each of its requests in (no
/// handler here reads a body from a task of its own).
#[derive(Clone)]
pub struct Clock(Arc<Mutex<Pin<Box<Sleep>>>>);

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock with nothing armed yet (a tokio timer is registered only
    /// when it is first waited on).
    pub fn new() -> Self {
        // Far enough that the first wait always moves it earlier.
        let never = Instant::now() + Duration::from_secs(86_400 * 365);
        Self(Arc::new(Mutex::new(Box::pin(tokio::time::sleep_until(
            never,
        )))))
    }

    /// Ready once `deadline` has passed; until then, the task is woken at
    /// `deadline` or at an earlier armed time (when it polls again, the
    /// clock re-arms for `deadline`).
    pub fn poll_until(&self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let mut sleep = self.0.lock().expect("clock lock");
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                // What passed is `deadline` itself.
                Poll::Ready(()) if sleep.deadline() >= deadline => return Poll::Ready(()),
                // An earlier wait's time passed: arm for this one (already
                // past, the next poll says so at once).
                Poll::Ready(()) => sleep.as_mut().reset(deadline),
            }
        }
    }

    /// The request's connection's clock ([`crate::serve`] puts it in its
    /// extensions, [`crate::Connection`]), or one of its own (under
    /// `axum::serve`, say).
    pub fn of(request: &axum::extract::Request) -> Self {
        request
            .extensions()
            .get::<crate::Connection>()
            .map(|connection| connection.clock.clone())
            .unwrap_or_default()
    }

    /// A future that ends at `deadline`.
    pub fn until(&self, deadline: Instant) -> Until {
        Until {
            clock: self.clone(),
            deadline,
        }
    }
}

/// Ends when its deadline has passed ([`Clock::until`]).
pub struct Until {
    clock: Clock,
    deadline: Instant,
}

impl Future for Until {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.clock.poll_until(self.deadline, cx)
    }
}

impl hyper::rt::Sleep for Until {}

/// hyper's timer for one connection (its header read timeout), on the
/// connection's [`Clock`].
#[derive(Clone)]
pub struct ConnectionTimer(pub Clock);

impl hyper::rt::Timer for ConnectionTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.until(Instant::now() + duration))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.until(deadline.into()))
    }
}

/// Gives the request's body a timeout per part: each must arrive within
/// `timeout` of the last (else the handler reading it fails with a 4xx).
/// A body already complete (a GET's) is left as it is.
pub fn per_part(mut request: axum::extract::Request, timeout: Duration) -> axum::extract::Request {
    use hyper::body::Body as _;
    if request.body().is_end_stream() {
        return request;
    }
    let clock = Clock::of(&request);
    let body = std::mem::take(request.body_mut());
    *request.body_mut() = axum::body::Body::new(PerPart {
        body,
        clock,
        timeout,
        waiting_until: None,
    });
    request
}

/// A body part that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body stopped arriving (nothing for {0:?})")]
pub struct BodyTimedOut(Duration);

/// A body whose parts must each arrive within `timeout` ([`per_part`]).
struct PerPart {
    body: axum::body::Body,
    clock: Clock,
    timeout: Duration,
    /// While waiting for a part: until when.
    waiting_until: Option<Instant>,
}

impl hyper::body::Body for PerPart {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting_until = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let until = *this
                    .waiting_until
                    .get_or_insert_with(|| Instant::now() + timeout);
                match this.clock.poll_until(until, cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimedOut(timeout).into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `until` once, with a waker that counts its wakes.
    fn poll_once(until: &mut Until, wakes: &Arc<Wakes>) -> Poll<()> {
        let waker = std::task::Waker::from(wakes.clone());
        Pin::new(until).poll(&mut Context::from_waker(&waker))
    }

    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_deadline_passes_on_time_on_one_shared_timer() {
        let clock = Clock::new();
        let wakes = Arc::new(Wakes::default());
        let start = Instant::now();
        // A wait armed at +10 s, then given up (its head arrived).
        let mut first = clock.until(start + Duration::from_secs(10));
        assert!(poll_once(&mut first, &wakes).is_pending());
        drop(first);
        // A later wait, to +15 s: the armed +10 s stays.
        let mut second = clock.until(start + Duration::from_secs(15));
        assert!(poll_once(&mut second, &wakes).is_pending());
        assert_eq!(
            clock.0.lock().unwrap().deadline(),
            start + Duration::from_secs(10),
            "a later deadline does not move the armed timer"
        );
        // At +10 s the armed time passes: woken, but not yet due.
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        assert!(poll_once(&mut second, &wakes).is_pending());
        assert_eq!(
            clock.0.lock().unwrap().deadline(),
            start + Duration::from_secs(15),
            "re-armed for the deadline waited for"
        );
        tokio::time::sleep_until(start + Duration::from_millis(14_999)).await;
        assert!(poll_once(&mut second, &wakes).is_pending());
        tokio::time::sleep_until(start + Duration::from_secs(15)).await;
        assert!(poll_once(&mut second, &wakes).is_ready());
        assert!(
            wakes.0.load(std::sync::atomic::Ordering::SeqCst) >= 2,
            "the waiting task was woken"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_moves_the_timer_forward() {
        let clock = Clock::new();
        let wakes = Arc::new(Wakes::default());
        let start = Instant::now();
        let mut late = clock.until(start + Duration::from_secs(60));
        assert!(poll_once(&mut late, &wakes).is_pending());
        drop(late);
        let mut soon = clock.until(start + Duration::from_secs(1));
        assert!(poll_once(&mut soon, &wakes).is_pending());
        tokio::time::sleep_until(start + Duration::from_secs(1)).await;
        assert!(poll_once(&mut soon, &wakes).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_is_ready_at_once() {
        let clock = Clock::new();
        let wakes = Arc::new(Wakes::default());
        let mut armed = clock.until(Instant::now() + Duration::from_millis(5));
        assert!(poll_once(&mut armed, &wakes).is_pending());
        tokio::time::advance(Duration::from_millis(50)).await;
        // Past the armed time and past this one's.
        let mut past = clock.until(Instant::now() - Duration::from_millis(10));
        assert!(poll_once(&mut past, &wakes).is_ready());
    }
}
