//! The capacity planner: Little's law over the query's load.

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use boxoffice_contract::capacity::{self, Demand, Plan};
use boxoffice_contract::Problem;

use super::problem::invalid;

/// `GET /admin/v1/capacity?arrival_rate=…&service_time_ms=…[&utilization=0.7]
/// [&per_partition_rate=1000][&per_consumer_rate=…][&spike_rate=…&spike_s=…]`
/// Little's law: workers and partitions for a load, the backlog of a spike
/// and how long it takes to drain.
#[utoipa::path(
    get,
    path = "/admin/v1/capacity",
    security(("admin_token" = [])),
    tag = "capacity",
    params(boxoffice_contract::capacity::Demand),
    responses(
        (status = 200, description = "The plan", body = Plan),
        (status = 400, description = "`bad-request`: a missing or non-numeric parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn capacity(
    query: Result<Query<Demand>, QueryRejection>,
) -> Result<axum::Json<Plan>, Problem> {
    let Query(demand) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    capacity::plan(&demand)
        .map(axum::Json)
        .map_err(|e| invalid(e.field, e.rule))
}
