// rota's dashboard: draws the page its URL names from the /v1 API, and
// redraws it when the server's event stream says something changed.
// No framework and no build step: the binary serves this file as it is.
'use strict';

const meta = (name) => document.querySelector(`meta[name="${name}"]`)?.content ?? '';
const CSRF = meta('csrf-token');
const CAN_OPERATE = meta('rota-can').split(' ').includes('operate');
const EVENTS_AFTER = meta('rota-events-after');
const PAGE_SIZE = 50;
// Redraws wait this long after an event, so that a burst of events costs one redraw.
const REDRAW_DELAY_MS = 500;
// Pages that show what no event announces (queues, instances) are also redrawn this often.
const POLL_MS = 5000;

const TASK_STATES = ['pending', 'processing', 'processed', 'error', 'compensating', 'compensated', 'cancelled'];

// ---------------------------------------------------------------------------
// DOM helpers. Text always goes in as text nodes, never as HTML.

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

function setAttributes(el, attrs) {
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

function section(title, ...children) {
  const id = 'section-' + title.toLowerCase().replace(/[^a-z0-9]+/g, '-');
  return h('section', { 'aria-labelledby': id }, h('h2', { id }, title), children);
}

// A section across the whole width of the overview's grid, for wide tables.
function wideSection(title, ...children) {
  const element = section(title, ...children);
  element.classList.add('wide');
  return element;
}

function table(name, headers, rows, empty = 'Nothing here.') {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h('table', { 'aria-label': name },
    h('thead', null, h('tr', null, headers.map((header) => h('th', { scope: 'col' }, header)))),
    h('tbody', null, rows));
}

function badge(state, title) {
  return h('span', { class: `badge state-${state}`, title: title ?? null }, state);
}

/** "paused" beside a task's state while an operator's pause holds it. */
function pausedBadge(task) {
  return task.paused ? h('span', { class: 'badge paused', title: 'Paused: it starts no new step until resumed' }, 'paused') : null;
}

/** "workflow paused" beside a task's state while its workflow is paused (no claim takes it). */
function workflowPausedBadge(task) {
  return task.workflow_paused
    ? h('span', { class: 'badge paused', title: 'Its workflow is paused: no Scheduler claims it until the workflow is resumed' }, 'workflow paused')
    : null;
}

/** A workflow's Pause or Resume button; `describedBy` names its row. */
function workflowPauseAction(workflow, describedBy) {
  const path = `/v1/workflows/${encodeURIComponent(workflow.name)}`;
  return workflow.paused
    ? action('Resume', `Resume workflow ${workflow.name}? Schedulers claim its waiting tasks again.`,
      (reason) => api(`${path}/resume`, { method: 'POST', body: { reason } }), () => `${workflow.name} resumed.`, { describedBy })
    : action('Pause', `Pause workflow ${workflow.name}? No Scheduler claims its tasks until it is resumed; tasks already running go on.`,
      (reason) => api(`${path}/pause`, { method: 'POST', body: { reason } }), () => `${workflow.name} paused.`, { describedBy });
}

/** "paused" with who paused the workflow, when and why. */
function workflowPausedNote(workflow) {
  if (!workflow.paused) return null;
  const pause = workflow.pause;
  const why = pause?.reason ? `: ${pause.reason}` : '';
  return h('span', { class: 'badge paused', title: `Paused by ${pause?.by ?? '?'} at ${time(pause?.at)}${why}` }, 'paused');
}

/** "at risk" beside a task's state while a deadline warning of its lease stands. */
function atRisk(task) {
  return task.at_risk_since === null || task.at_risk_since === undefined ? null
    : h('span', { class: 'badge at-risk', title: `A deadline warning was raised at ${new Date(task.at_risk_since).toISOString()}` }, 'at risk');
}

/** Why a Pending task has not started, when its concurrency key holds it back
 * (the API's `waiting_for`: "waiting for concurrency key customer=c1 (1/1 in use)"). */
function waitingNote(task) {
  return task.waiting_for
    ? h('span', { class: 'badge waiting', title: 'It starts when a task of its concurrency key ends' }, task.waiting_for)
    : null;
}

/** Where a child workflow's task comes from: its parent and the step that started it. */
function parentNote(parent) {
  return parent ? ['child of ', taskLink(parent.task), `, step ${parent.step} (attempt ${parent.attempt})`] : null;
}

function json(value) {
  return h('pre', { class: 'json' }, value === null || value === undefined ? '—' : JSON.stringify(value, null, 2));
}

function time(ms) {
  if (ms === null || ms === undefined) return '—';
  const date = new Date(ms);
  return h('time', { datetime: date.toISOString(), title: date.toISOString() }, relative(ms));
}

function relative(ms) {
  const seconds = Math.round((ms - Date.now()) / 1000);
  const abs = Math.abs(seconds);
  const [amount, unit] = abs < 60 ? [abs, 's'] : abs < 3600 ? [Math.round(abs / 60), 'min'] : abs < 86400 ? [Math.round(abs / 3600), 'h'] : [Math.round(abs / 86400), 'd'];
  return seconds <= 0 ? `${amount} ${unit} ago` : `in ${amount} ${unit}`;
}

// A moment to the millisecond, for events closer together than "1 min ago" can tell apart.
function clockText(ms) {
  const date = new Date(ms);
  return `${date.toLocaleTimeString('en-GB')}.${String(date.getMilliseconds()).padStart(3, '0')}`;
}

function clock(ms) {
  return h('time', { datetime: new Date(ms).toISOString(), title: new Date(ms).toISOString() }, clockText(ms));
}

function duration(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60000).toFixed(1)} min`;
}

function taskLink(id) {
  return h('a', { href: `/ui/tasks/${encodeURIComponent(id)}` }, id);
}

function workflowLink(name) {
  return h('a', { href: `/ui/workflows/${encodeURIComponent(name)}` }, name);
}

function number(n) {
  return Number(n).toLocaleString('en');
}

// ---------------------------------------------------------------------------
// The API.

class ApiError extends Error {}

async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET') {
    headers['X-CSRF-Token'] = CSRF;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
  }
  const response = await fetch(path, { method, headers, credentials: 'same-origin', body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) {
    location.assign(`/ui/login?next=${encodeURIComponent(location.pathname + location.search)}`);
    throw new ApiError('signed out');
  }
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(data?.error?.reason ?? `${method} ${path}: ${response.status}`);
  return data;
}

const q = (params) => {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== null && value !== undefined && value !== '') search.set(key, value);
  const text = search.toString();
  return text ? `?${text}` : '';
};

function notice(text) {
  document.getElementById('problem').textContent = '';
  document.getElementById('notice').textContent = text;
}

function problem(text) {
  document.getElementById('notice').textContent = '';
  document.getElementById('problem').textContent = text;
}

// ---------------------------------------------------------------------------
// Actions: a button that asks first, then calls the API and redraws.

let dialogOpen = false;

function confirmAction(question, extra = null) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: 'confirm', 'aria-label': 'Confirm' });
    const close = (answer) => { dialog.close(); dialog.remove(); dialogOpen = false; resolve(answer); };
    append(dialog, [
      h('p', null, question),
      extra,
      h('div', { class: 'buttons' },
        h('button', { type: 'button', class: 'danger', onclick: () => close(true) }, 'Confirm'),
        h('button', { type: 'button', onclick: () => close(false) }, 'Back')),
    ]);
    dialog.addEventListener('cancel', (event) => { event.preventDefault(); close(false); });
    document.body.append(dialog);
    dialogOpen = true;
    dialog.showModal();
  });
}

// A button for an operator action; absent for a viewer who may not operate.
// `extra` (built afresh for each click) goes into the confirmation, for
// what the action needs typed in. Unless `reason` is false, the
// confirmation asks why too, and `perform` gets the answer (null if none):
// the API keeps it with who acted, in the task's history or the audit log.
function action(label, question, perform, done, { describedBy, extra, reason = true } = {}) {
  if (!CAN_OPERATE) return null;
  return h('button', {
    type: 'button', class: 'action', 'aria-describedby': describedBy,
    onclick: async (event) => {
      const button = event.currentTarget;
      const why = reason ? h('input', { type: 'text', class: 'reason', autocomplete: 'off', maxlength: 1000 }) : null;
      const asked = [extra ? extra() : null, why ? h('label', { class: 'signal' }, 'Reason (optional), kept with who did it:', why) : null];
      if (!(await confirmAction(question, asked))) return;
      button.disabled = true;
      try {
        const result = await perform(why ? why.value.trim() || null : null);
        notice(done(result));
        await redraw();
        follow(stream());
      } catch (error) {
        problem(error.message);
        button.disabled = false;
      }
    },
  }, label);
}

// ---------------------------------------------------------------------------
// Pages. Each one builds its controls once (`mount`) and refills its data
// (`update`) on every redraw, so a redraw never loses what is typed or chosen.

const pages = [
  [/^\/ui\/?$/, overviewPage],
  [/^\/ui\/tasks\/?$/, tasksPage],
  [/^\/ui\/tasks\/([^/]+)\/?$/, taskPage],
  [/^\/ui\/alerts\/?$/, alertsPage],
  [/^\/ui\/queues\/?$/, queuesPage],
  [/^\/ui\/queues\/([^/]+)\/?$/, queuePage],
  [/^\/ui\/workflows\/?$/, workflowsPage],
  [/^\/ui\/workflows\/([^/]+)\/?$/, workflowPage],
  [/^\/ui\/schedules\/?$/, schedulesPage],
  [/^\/ui\/batches\/?$/, batchesPage],
];

let current = null;

function overviewPage() {
  const body = h('div', { class: 'overview' });
  return {
    title: 'Overview', nav: '/ui', polls: true, body,
    async update() {
      const [counts, activity, alerts, breakers, queues, instances] = await Promise.all([
        api('/v1/tasks/counts'), api('/v1/activity?minutes=15'), api('/v1/alerts?limit=10'),
        api('/v1/breakers'), api('/v1/queues'), api('/v1/instances'),
      ]);
      const notClosed = breakers.filter((breaker) => breaker.state !== 'closed');
      body.replaceChildren(
        section('Tasks by state',
          h('ul', { class: 'states' }, TASK_STATES.map((state) => h('li', null,
            h('a', { href: `/ui/tasks?state=${state}`, class: `count state-${state}` },
              h('span', { class: 'label' }, state), ' ', h('span', { class: 'number' }, number(counts.counts[state] ?? 0)))))),
          h('p', { class: 'total' }, `${number(counts.total)} tasks in all`)),
        section('Activity', activityChart(activity)),
        section('Open alerts', alertsTable(alerts, 'No alerts.')),
        section('Circuit breakers', table('Circuit breakers', ['Endpoint', 'State', 'Failures', 'Open until', 'Probe', 'Reported'],
          notClosed.map((breaker) => h('tr', null, h('td', { class: 'wrap' }, breaker.endpoint), h('td', null, badge(breaker.state), breakerScope(breaker)),
            h('td', { class: 'n' }, breaker.consecutive_failures ?? '—'), h('td', null, time(breaker.open_until)),
            h('td', { class: 'wrap' }, breakerProbe(breaker)), h('td', null, time(breaker.reported_at)))),
          'Every circuit breaker is closed.')),
        wideSection('Queues', queuesTable(queues)),
        wideSection('Instances', instancesTable(instances)));
    },
  };
}

// Under a breaker's state, where it is kept: a shared breaker is one row
// of the store, seen by every process; a local one is the reporting process's own.
function breakerScope(breaker) {
  return breaker.shared
    ? h('span', { class: 'scope', title: 'Shared through the store by every process: while open, it holds its endpoint\'s calls' }, 'shared')
    : h('span', { class: 'scope wrap', title: 'Kept by one process: while open, it fails its calls fast' },
      `local to ${breaker.instance ?? '?'}${breaker.agent ? ` (${breaker.agent})` : ''}`);
}

// Who holds the probe of a half-open shared breaker (`INSTANCE TASK/STEP#ATTEMPT`),
// and until when: then another process may probe.
function breakerProbe(breaker) {
  if (!breaker.probe_holder) return '—';
  return [breaker.probe_holder, h('span', { class: 'until' }, 'until ', time(breaker.probe_until))];
}

function activityChart(activity) {
  const minutes = activity.minutes;
  const last = minutes[minutes.length - 1] ?? {};
  const width = 600, height = 120, pad = 24;
  const most = Math.max(1, ...minutes.map((m) => m.processed + m.errors));
  const slowest = Math.max(1, ...minutes.map((m) => m.step_latency_p50_ms ?? 0));
  const barWidth = (width - pad) / Math.max(1, minutes.length);
  const bars = minutes.map((m, i) => {
    const processed = (m.processed / most) * (height - pad);
    const errors = (m.errors / most) * (height - pad);
    return s('g', null,
      s('rect', { x: pad + i * barWidth + 1, y: height - pad - processed, width: barWidth - 2, height: processed, class: 'bar-processed' },
        s('title', null, `${new Date(m.start).toLocaleTimeString()}: ${m.processed} processed, ${m.errors} errors, ${m.steps_completed} steps`)),
      s('rect', { x: pad + i * barWidth + 1, y: height - pad - processed - errors, width: barWidth - 2, height: errors, class: 'bar-error' }));
  });
  const points = minutes.map((m, i) => m.step_latency_p50_ms === null ? null
    : `${pad + (i + 0.5) * barWidth},${height - pad - (m.step_latency_p50_ms / slowest) * (height - pad)}`).filter(Boolean);
  const latency = (ms) => ms === null || ms === undefined ? '—' : `${Number(ms).toFixed(1)} ms`;
  return h('div', { class: 'activity' },
    h('dl', { class: 'figures' },
      h('dt', null, 'Processed, last minute'), h('dd', null, number(last.processed ?? 0)),
      h('dt', null, 'Errors, last minute'), h('dd', null, number(last.errors ?? 0)),
      h('dt', null, 'Steps completed, last minute'), h('dd', null, number(last.steps_completed ?? 0)),
      h('dt', null, 'Step latency p50 / p99'), h('dd', null, `${latency(last.step_latency_p50_ms)} / ${latency(last.step_latency_p99_ms)}`)),
    s('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img',
      'aria-label': `Tasks processed per minute over the last ${minutes.length} minutes, with the median step latency as a line` },
    s('line', { x1: pad, y1: height - pad, x2: width, y2: height - pad, class: 'axis' }),
    s('text', { x: 0, y: 12, class: 'axis-label' }, number(most)),
    bars,
    points.length > 1 ? s('polyline', { points: points.join(' '), class: 'latency-line' }) : null),
    activity.complete ? null : h('p', { class: 'hint' }, `From the latest ${number(activity.events_read)} events only.`));
}

function alertsTable(alerts, empty) {
  return table('Alerts', ['At', 'Task', 'Step', 'Reason'], alerts.map((alert) => h('tr', null,
    h('td', null, time(alert.at)), h('td', null, taskLink(alert.task_id)), h('td', null, alert.step ?? '—'), h('td', null, alert.reason))), empty);
}

function queuesTable(queues) {
  return table('Queues', ['Queue', 'Ready', 'Leased', 'Delayed', 'Dead-lettered', 'Paused', 'Oldest'], queues.map((queue) => h('tr', null,
    h('td', null, h('a', { href: `/ui/queues/${encodeURIComponent(queue.queue)}` }, queue.queue)),
    h('td', { class: 'n' }, number(queue.ready)), h('td', { class: 'n' }, number(queue.leased)), h('td', { class: 'n' }, number(queue.delayed)),
    h('td', { class: 'n' }, number(queue.dead_lettered)), h('td', null, queue.paused ? 'paused' : '—'), h('td', null, time(queue.oldest_ready_at)))),
  'No queues yet.');
}

function instancesTable(instances) {
  return table('Instances', ['Instance', 'Roles', 'Agents', 'Last heartbeat', 'Status'], instances.instances.map((instance) => h('tr', null,
    h('td', null, instance.instance), h('td', null, instance.roles.join(', ') || '—'), h('td', null, instance.agents.join(', ') || '—'),
    h('td', null, time(instance.last_heartbeat)),
    h('td', null, instance.live ? 'live' : 'silent', instance.supervisor_leader ? h('span', { class: 'badge leader' }, 'leads the Supervisors') : null))),
  'No instance has reported a heartbeat.');
}

/** A task's tags, each a link to the tasks that have it. */
function tagLinks(tags) {
  const entries = Object.entries(tags ?? {});
  if (entries.length === 0) return '—';
  return entries.map(([key, value]) =>
    h('a', { class: 'tag', href: `/ui/tasks${q({ tag: `${key}=${value}` })}`, title: `Tasks tagged ${key}=${value}` }, `${key}=${value}`));
}

function tasksPage(params, query) {
  const state = query.get('state') ?? '';
  const workflow = query.get('workflow') ?? '';
  const before = query.get('before') ?? '';
  // Only the tasks at risk: a deadline warning raised during their lease.
  const risky = query.get('at_risk') === 'true' ? 'true' : '';
  // A label (`key=value`) and the start of the ids, typed by the operator.
  const tag = query.get('tag') ?? '';
  const idPrefix = query.get('id_prefix') ?? '';
  // A parent's children, reached from its task page; kept by the form.
  const parent = query.get('parent') ?? '';
  const trail = (query.get('trail') ?? '').split(',').filter(Boolean);
  const workflowSelect = h('select', { id: 'filter-workflow', name: 'workflow' }, h('option', { value: '' }, 'any workflow'));
  const filters = h('form', { method: 'get', action: '/ui/tasks', class: 'filters' },
    h('label', { for: 'filter-state' }, 'State'),
    h('select', { id: 'filter-state', name: 'state', onchange: (event) => event.target.form.requestSubmit() },
      h('option', { value: '' }, 'any state'), TASK_STATES.map((name) => h('option', { value: name, selected: name === state }, name))),
    h('label', { for: 'filter-workflow' }, 'Workflow'), workflowSelect,
    h('label', { for: 'filter-at-risk', class: 'check' },
      h('input', { id: 'filter-at-risk', name: 'at_risk', type: 'checkbox', value: 'true', checked: risky === 'true',
        onchange: (event) => event.target.form.requestSubmit() }), ' At risk'),
    h('label', { for: 'filter-tag' }, 'Tag'),
    h('input', { id: 'filter-tag', name: 'tag', type: 'search', placeholder: 'key=value', value: tag, autocomplete: 'off' }),
    h('label', { for: 'filter-id-prefix' }, 'Id starts with'),
    h('input', { id: 'filter-id-prefix', name: 'id_prefix', type: 'search', value: idPrefix, autocomplete: 'off' }),
    parent ? h('input', { name: 'parent', type: 'hidden', value: parent }) : null,
    h('button', { type: 'submit' }, 'Filter'));
  workflowSelect.addEventListener('change', () => filters.requestSubmit());
  const find = h('form', { class: 'find', onsubmit: (event) => {
    event.preventDefault();
    const id = event.target.elements.id.value.trim();
    if (id) location.assign(`/ui/tasks/${encodeURIComponent(id)}`);
  } }, h('label', { for: 'find-id' }, 'Task id'), h('input', { id: 'find-id', name: 'id', type: 'search', autocomplete: 'off' }),
  h('button', { type: 'submit' }, 'Find'));
  const summary = h('p', { class: 'total' });
  const bulk = bulkActions({ state, workflow, tag, idPrefix, parent, risky });
  const list = h('div');
  const paging = h('nav', { class: 'paging', 'aria-label': 'Pages' });
  const body = h('div', null, h('div', { class: 'controls' }, filters, find), summary, bulk, list, paging);
  let workflowsLoaded = false;
  return {
    title: 'Tasks', nav: '/ui/tasks', body,
    async update() {
      const [tasks, counts, workflows] = await Promise.all([
        api(`/v1/tasks${q({ state, workflow, at_risk: risky, tag, id_prefix: idPrefix, parent, before, limit: PAGE_SIZE })}`),
        api(`/v1/tasks/counts${q({ workflow, tag, id_prefix: idPrefix, parent })}`),
        workflowsLoaded ? null : api('/v1/workflows'),
      ]);
      if (workflows) {
        workflowsLoaded = true;
        const names = new Set(workflows.map((w) => w.name));
        if (workflow) names.add(workflow);
        append(workflowSelect, [...names].sort().map((name) => h('option', { value: name, selected: name === workflow }, name)));
      }
      const matching = state ? counts.counts[state] ?? 0 : counts.total;
      const which = `${state ? ` in state ${state}` : ''}${workflow ? ` of workflow ${workflow}` : ''}${tag ? ` tagged ${tag}` : ''}${idPrefix ? ` with ids starting ${idPrefix}` : ''}`;
      // The counts are by state: at risk, the page says what it lists instead.
      summary.replaceChildren(risky
        ? `Tasks at risk${which}: a deadline warning was raised during their lease`
        : `${number(matching)} ${matching === 1 ? 'task' : 'tasks'}${which}`,
      ...(parent ? [' started by ', taskLink(parent)] : []));
      list.replaceChildren(table('Tasks', ['Id', 'Workflow', 'State', 'Failures', 'Tags', 'Created', 'Updated'], tasks.map((task) => h('tr', null,
        h('td', null, taskLink(task.id)), h('td', null, h('a', { href: `/ui/workflows/${encodeURIComponent(task.workflow)}` }, task.workflow)),
        h('td', null, badge(task.state), pausedBadge(task), atRisk(task), task.state === 'pending' && task.not_before > Date.now() ? h('span', { class: 'hint' }, ' waits until ', time(task.not_before)) : null),
        h('td', { class: 'n' }, task.failure_count), h('td', null, tagLinks(task.tags)), h('td', null, time(task.created_at)), h('td', null, time(task.updated_at)))),
      'No task matches.'));
      const link = (label, target, rel) => target === null
        ? h('span', { class: 'disabled', 'aria-disabled': 'true' }, label)
        : h('a', { href: `/ui/tasks${q(target)}`, rel }, label);
      const filter = { state, workflow, at_risk: risky, tag, id_prefix: idPrefix, parent };
      const newer = before ? { ...filter, before: trail[trail.length - 1], trail: trail.slice(0, -1).join(',') } : null;
      const older = tasks.length === PAGE_SIZE ? { ...filter, before: tasks[tasks.length - 1].id, trail: [...trail, before].filter(Boolean).join(',') } : null;
      // The first page is reached with no cursor at all.
      if (newer && !newer.before) delete newer.before;
      paging.replaceChildren(link('Newer', newer, 'prev'), link('Older', older, 'next'));
    },
  };
}

// "Cancel matching…" and "Resubmit matching…": a batch over every task the
// list's filters select (the bulk action of `POST /v1/batches`). Offered only
// when a filter is applied, since a batch needs one, and not with At risk,
// which a batch's filter cannot express. A resubmit acts on tasks in Error
// only, so it is offered with no state filter (then Error) or Error.
function bulkActions({ state, workflow, tag, idPrefix, parent, risky }) {
  if (!CAN_OPERATE || risky || !(state || workflow || tag || idPrefix || parent)) return null;
  const bulk = (action, label, selected) => {
    const filter = { state: selected || null, workflow: workflow || null, tag: tag ? [tag] : [], id_prefix: idPrefix || null, parent: parent || null };
    return h('button', {
      type: 'button', class: 'action',
      onclick: async (event) => {
        const button = event.currentTarget;
        button.disabled = true;
        try {
          // The dry run: how many tasks the filter selects now.
          const counts = await api(`/v1/tasks/counts${q({ workflow, tag, id_prefix: idPrefix, parent })}`);
          const matching = selected ? counts.counts[selected] ?? 0 : counts.total;
          const which = describeFilter(filter);
          if (matching === 0) {
            notice(`No task matches (${which}): nothing to ${action}.`);
            return;
          }
          const others = describeFilter({ ...filter, state: null });
          let reason = null;
          const extra = h('label', { class: 'signal' }, 'Reason (optional), kept with the batch and in each task\'s history:',
            reason = h('input', { type: 'text', class: 'reason', autocomplete: 'off', autofocus: true }));
          const tasks = `${number(matching)} ${matching === 1 ? 'task' : 'tasks'}`;
          const question = action === 'cancel'
            ? `Cancel the ${tasks} matching (${which})? Tasks that have finished meanwhile are skipped.`
            : `Resubmit the ${tasks} in Error${others ? ` matching (${others})` : ''}? Each runs again from its first unfinished step.`;
          if (!(await confirmAction(question, extra))) return;
          const batch = await api('/v1/batches', { method: 'POST', body: { action, filter, reason: reason.value.trim() || null } });
          location.assign(`/ui/batches#${batchRowId(batch.id)}`);
        } catch (error) {
          problem(error.message);
        } finally {
          button.disabled = false;
        }
      },
    }, label);
  };
  return h('div', { class: 'actions bulk' },
    bulk('cancel', 'Cancel matching…', state),
    state === '' || state === 'error' ? bulk('resubmit', 'Resubmit matching…', 'error') : null);
}

/** A batch's filter in words: `state error, workflow fail, tag team=a`.
 * `madeAt`, a batch's creation: the bound the API closes its filter with
 * then (tasks created later are not its) goes without saying. */
function describeFilter(filter, madeAt = null) {
  const parts = [];
  if (filter.state) parts.push(`state ${filter.state}`);
  if (filter.workflow) parts.push(`workflow ${filter.workflow}`);
  for (const tag of filter.tag ?? []) parts.push(`tag ${tag}`);
  if (filter.id_prefix) parts.push(`id starting ${filter.id_prefix}`);
  if (filter.parent) parts.push(`children of ${filter.parent}`);
  if (filter.created_after) parts.push(`created from ${filter.created_after}`);
  const closedAtCreation = madeAt !== null && Math.abs(Date.parse(filter.created_before) - madeAt) < 1000;
  if (filter.created_before && !closedAtCreation) parts.push(`created before ${filter.created_before}`);
  if (filter.ended_after) parts.push(`ended from ${filter.ended_after}`);
  if (filter.ended_before) parts.push(`ended before ${filter.ended_before}`);
  return parts.join(', ');
}

/** The id of a batch's row on the Batches page, the fragment that leads to it. */
function batchRowId(id) {
  return `batch-${id.replace(/[^A-Za-z0-9_-]/g, '_')}`;
}

// The bulk actions, newest first, with their progress. While one runs the
// page is redrawn every few seconds as well as on events, since a batch's
// progress is announced by no event of its own.
function batchesPage() {
  const body = h('div');
  const page = {
    title: 'Batches', nav: '/ui/batches', polls: false, body,
    async update() {
      const batches = await api('/v1/batches?limit=200');
      page.polls = batches.some((batch) => batch.state === 'running');
      const selected = decodeURIComponent(location.hash.slice(1));
      body.replaceChildren(
        h('p', { class: 'hint' }, 'Bulk actions on every task a filter selects, run by the Supervisor leader a page at a time. ',
          'Start one from the ', h('a', { href: '/ui/tasks' }, 'tasks list'), ' with a filter applied, or with ',
          h('code', null, 'rota cancel'), ' or ', h('code', null, 'rota resubmit'), ' given filters instead of an id.'),
        table('Batches', ['Batch', 'Action', 'By', 'Reason', 'Tasks', 'State', 'Progress', 'Last error', 'Created', 'Updated', ''],
          batches.map((batch) => batchRow(batch, selected)), 'No batches yet.'));
      const row = selected ? document.getElementById(selected) : null;
      if (row && !page.scrolled) {
        page.scrolled = true;
        row.scrollIntoView({ block: 'center' });
      }
    },
  };
  return page;
}

function batchRow(batch, selected) {
  const id = batchRowId(batch.id);
  const reached = batch.done + batch.skipped + batch.failed;
  const counts = `${number(batch.done)} done, ${number(batch.skipped)} skipped, ${number(batch.failed)} failed`;
  return h('tr', { id, class: id === selected ? 'selected' : null, 'aria-current': id === selected ? 'true' : null },
    h('th', { scope: 'row', id: `${id}-name` }, h('code', null, batch.id)),
    // An action this page does not know is shown as the API names it.
    h('td', null, batch.action),
    h('td', null, batch.requested_by),
    h('td', null, batch.reason ?? '—'),
    h('td', null, describeFilter(batch.filter, batch.created_at) || '—'),
    h('td', null, badge(batch.state)),
    h('td', { class: 'progress' },
      h('progress', { max: Math.max(1, batch.total), value: batch.total === 0 ? Number(batch.state === 'done') : reached,
        'aria-label': `Progress of ${batch.id}`, title: counts }),
      h('span', { class: 'figure' }, `${number(reached)} of ${number(batch.total)}`),
      h('span', { class: 'hint counts' }, counts)),
    h('td', { class: 'error-text' }, batch.last_error ?? '—'),
    h('td', null, time(batch.created_at)),
    h('td', null, time(batch.updated_at)),
    h('td', null, batch.state === 'running'
      ? action('Stop', `Stop batch ${batch.id}? It stops at its next page; the tasks it has not reached are left as they are.`,
        (reason) => api(`/v1/batches/${encodeURIComponent(batch.id)}/stop`, { method: 'POST', body: { reason } }), () => `Batch ${batch.id} stopped.`, { describedBy: `${id}-name` })
      : null));
}

function taskPage([id]) {
  const taskId = decodeURIComponent(id);
  const body = h('div', { class: 'task' });
  let definitions = new Map();
  // The for_each steps whose instances the operator opened: a redraw keeps them open.
  const openInstances = new Set();
  return {
    title: `Task ${taskId}`, nav: '/ui/tasks', body, stream: `/v1/tasks/${encodeURIComponent(taskId)}/events`,
    async update() {
      const [task, history] = await Promise.all([
        api(`/v1/tasks/${encodeURIComponent(taskId)}`), api(`/v1/tasks/${encodeURIComponent(taskId)}/history`),
      ]);
      const key = `${task.workflow}@${task.version}`;
      if (!definitions.has(key)) {
        definitions.set(key, await api(`/v1/workflows/${encodeURIComponent(task.workflow)}/versions/${task.version}`).catch(() => null));
      }
      const definition = definitions.get(key);
      const ended = ['processed', 'compensated', 'cancelled'].includes(task.state);
      const actions = h('div', { class: 'actions' },
        ended ? null : action('Cancel', `Cancel task ${taskId}? Its steps in flight are not waited for, and completed steps are compensated if the workflow says so.`,
          (reason) => api(`/v1/tasks/${encodeURIComponent(taskId)}/cancel`, { method: 'POST', body: { reason } }), () => 'Cancelled.'),
        task.paused
          ? action('Resume', `Resume task ${taskId}? A Scheduler takes it up again and starts its next steps.`,
            (reason) => api(`/v1/tasks/${encodeURIComponent(taskId)}/resume`, { method: 'POST', body: { reason } }), () => 'Resumed.')
          : task.state === 'error' || ended ? null
            : action('Pause', `Pause task ${taskId}? Its steps in flight finish, and no new step starts until it is resumed.`,
              (reason) => api(`/v1/tasks/${encodeURIComponent(taskId)}/pause`, { method: 'POST', body: { reason } }), () => 'Paused.'),
        action('Resubmit', `Resubmit task ${taskId} from its first unfinished step?`,
          (reason) => api(`/v1/tasks/${encodeURIComponent(taskId)}/resubmit`, { method: 'POST', body: { reason } }), () => 'Resubmitted.'));
      // A for_each step's instances (`NAME[i]`) are shown under their step, not as steps of their own.
      const steps = task.steps.filter((step) => instanceOf(step.name) === null);
      const instances = instancesByStep(task.steps);
      const children = task.children ?? [];
      body.replaceChildren();
      // `append`, unlike replaceChildren, leaves out the sections a task has not (null).
      append(body, [
        h('p', { class: 'subtitle' }, badge(task.state), pausedBadge(task), workflowPausedBadge(task), atRisk(task), waitingNote(task), ' ', 'workflow ',
          workflowLink(task.workflow), ` version ${task.version}`, task.parent ? [' · ', parentNote(task.parent)] : null),
        actions,
        section('Workflow', dag(definition?.steps ?? steps.map((step, i) => ({ name: step.name, depends_on: i ? [steps[i - 1].name] : [] })), steps, instances)),
        section('Steps', table('Steps', ['Step', 'Agent', 'State', 'Attempt', 'Complete by', 'Last error', ''], steps.map((step) => {
          const label = `step-label-${step.position}`;
          return [h('tr', null,
            h('th', { scope: 'row', id: label }, step.name), h('td', null, stepDoer(step, children)),
            h('td', null, badge(step.state, step.when ? `when: ${step.when}` : null)),
            h('td', { class: 'n' }, step.attempt), h('td', null, time(step.complete_by)), h('td', { class: 'error-text' }, step.last_error ?? '—'),
            h('td', null, awaitsSignal(task, step) ? signalAction(taskId, step, label) : null,
              resubmitStepAction(task, step, label))),
          instances.has(step.name) ? instancesRow(step, instances.get(step.name), openInstances) : null];
        }))),
        children.length > 0 || steps.some((step) => step.workflow) ? section('Children', childrenTable(task.id, children)) : null,
        section('Attempts', attempts(task, history)),
        section('Fields', h('dl', { class: 'fields' },
          field('State', badge(task.state)), field('Locked by', task.locked_by ?? '—'), field('Lease epoch', task.lease_epoch),
          field('Complete by', time(task.complete_by)), field('Warn at', time(task.warn_at)), field('At risk since', time(task.at_risk_since)),
          field('Not before', time(task.not_before)),
          field('Failure count', task.max_failures === null || task.max_failures === undefined ? task.failure_count : `${task.failure_count} of ${task.max_failures}`),
          field('Concurrency key', task.concurrency_key ?? '—'), field('Parent', task.parent ? [parentNote(task.parent), `, depth ${task.parent.depth}`] : '—'),
          field('Error', task.error ?? '—'), field('Callback URL', task.callback_url ?? '—'), field('Reply queue', task.reply_queue ?? '—'),
          field('Submitted by', task.submitter ?? '—'), field('Tags', tagLinks(task.tags)),
          field('Created', time(task.created_at)), field('Updated', time(task.updated_at)))),
        section('Input', json(task.input)),
        // An instance's output is in its step's, in item order.
        section('Output', json(task.output), steps.filter((step) => step.output !== null && step.output !== undefined).map((step) =>
          h('details', null, h('summary', null, `Step ${step.name}`), json(step.output)))),
        section('History', table('History', ['Seq', 'At', 'Event', 'Step', 'Attempt', 'Detail'], history.map((event) => h('tr', null,
          h('td', { class: 'n' }, event.seq), h('td', null, clock(event.at)), h('td', null, event.kind), h('td', null, event.step ?? '—'),
          h('td', { class: 'n' }, event.attempt ?? '—'), h('td', null, h('code', null, compact(event.detail)))))))]);
    },
  };
}

// Who does a step's work: its agent (and, for a callback step, the
// service completing it later), the signal it waits for, or its child
// workflow (with a link to the child its latest attempt started).
function stepDoer(step, children = []) {
  if (step.waits_for) return `waits for ${step.waits_for}`;
  if (step.workflow) {
    const child = children.filter((candidate) => candidate.step === step.name).sort((a, b) => b.attempt - a.attempt)[0];
    return [`workflow ${step.workflow}`, child ? [': ', taskLink(child.id)] : null];
  }
  if (step.callback) return `${step.agent}, then its callback`;
  return step.agent ?? '—';
}

// The child workflows a task's `workflow:` steps started, newest first.
function childrenTable(parent, children) {
  // The task list filters, counts, pages and acts on every child.
  const all = h('a', { href: `/ui/tasks${q({ parent })}` }, 'all of them in the task list');
  return [
    table('Children', ['Child', 'Workflow', 'State', 'Started by'], children.map((child) => h('tr', null,
      h('td', null, taskLink(child.id)), h('td', null, workflowLink(child.workflow)), h('td', null, badge(child.state)),
      h('td', null, `step ${child.step}, attempt ${child.attempt}`))), 'No child workflow started yet.'),
    // The API lists the newest 100.
    children.length > 0 ? h('p', { class: 'hint' }, children.length >= 100 ? 'The newest 100 children; ' : 'The children: ', all) : null,
  ];
}

// For an instance of a for_each step (`NAME[i]`), its step's name and its
// index; null for a step of the workflow itself.
function instanceOf(name) {
  const match = /^(.*)\[(\d+)\]$/.exec(name);
  return match ? { step: match[1], index: Number(match[2]) } : null;
}

// A for_each step's instances, by step name, in item order. Each has its
// `index`; `items` is the step's count of items (its input, the list),
// which instances not yet started are missing from.
function instancesByStep(steps) {
  const byStep = new Map();
  for (const step of steps) {
    const instance = instanceOf(step.name);
    if (instance === null) continue;
    if (!byStep.has(instance.step)) byStep.set(instance.step, []);
    byStep.get(instance.step).push({ ...step, index: instance.index });
  }
  const grouped = new Map();
  for (const [name, list] of byStep) {
    list.sort((a, b) => a.index - b.index);
    const own = steps.find((step) => step.name === name);
    const items = Array.isArray(own?.input) ? own.input.length : list.length;
    grouped.set(name, { list, items: Math.max(items, list.length) });
  }
  return grouped;
}

const STEP_STATE_ORDER = ['completed', 'running', 'failed', 'not_started', 'compensating', 'compensated', 'skipped'];

// "50 instances: 48 completed, 2 running"; items without an instance yet count as not started.
function instancesSummary({ list, items }) {
  const counts = new Map();
  for (const instance of list) counts.set(instance.state, (counts.get(instance.state) ?? 0) + 1);
  if (items > list.length) counts.set('not_started', (counts.get('not_started') ?? 0) + items - list.length);
  // A state this page does not know comes last.
  const rank = (state) => STEP_STATE_ORDER.includes(state) ? STEP_STATE_ORDER.indexOf(state) : STEP_STATE_ORDER.length;
  const parts = [...counts].sort(([a], [b]) => rank(a) - rank(b)).map(([state, n]) => `${number(n)} ${state.replace('_', ' ')}`);
  return `${number(items)} ${items === 1 ? 'instance' : 'instances'}: ${parts.join(', ')}`;
}

// A row under a for_each step's own: its instances' states counted, and
// each instance in a table that opens on demand.
function instancesRow(step, instances, openInstances) {
  const details = h('details', { class: 'instances', open: openInstances.has(step.name) },
    h('summary', null, instancesSummary(instances)),
    table(`Instances of ${step.name}`, ['Instance', 'Item', 'State', 'Attempt', 'Complete by', 'Last error'], instances.list.map((instance) => h('tr', null,
      h('th', { scope: 'row' }, instance.name), h('td', { class: 'n' }, instance.index), h('td', null, badge(instance.state)),
      h('td', { class: 'n' }, instance.attempt), h('td', null, time(instance.complete_by)),
      h('td', { class: 'error-text' }, instance.last_error ?? '—')))));
  details.addEventListener('toggle', () => {
    if (details.open) openInstances.add(step.name);
    else openInstances.delete(step.name);
  });
  return h('tr', { class: 'instances' }, h('td', { colspan: 7 }, details));
}

// Whether a step still takes its signal: it waits for one, has none yet,
// and its task can still run it.
function awaitsSignal(task, step) {
  const received = step.input !== null && typeof step.input === 'object' && 'signal' in step.input;
  return Boolean(step.waits_for) && !received && ['not_started', 'running'].includes(step.state)
    && ['pending', 'processing'].includes(task.state);
}

// Sends the signal a step waits for; its data is typed as JSON in the
// confirmation and checked before anything is sent.
function signalAction(taskId, step, describedBy) {
  let data = null;
  const extra = () => {
    data = h('textarea', { class: 'signal-data', rows: 4, spellcheck: 'false', 'aria-label': `Data of signal ${step.waits_for} (JSON)` });
    data.value = '{}';
    return h('label', { class: 'signal' }, `Data (JSON), the step's output:`, data);
  };
  const send = () => {
    let parsed;
    try {
      parsed = JSON.parse(data.value);
    } catch (error) {
      return Promise.reject(new ApiError(`signal ${step.waits_for}: the data is not valid JSON (${error.message}); nothing was sent`));
    }
    return api(`/v1/tasks/${encodeURIComponent(taskId)}/signals/${encodeURIComponent(step.waits_for)}`, { method: 'POST', body: parsed });
  };
  return action('Send signal', `Send signal ${step.waits_for} to task ${taskId}? Step ${step.name} completes with its data.`, send,
    (delivery) => delivery.completed ? `Signal ${step.waits_for} sent: step ${delivery.step} completed.`
      : `Signal ${step.waits_for} sent: kept until the task reaches step ${delivery.step}.`, { describedBy, extra, reason: false });
}

// Resubmit one step: the confirmation shows the task's input, which may be
// changed to run the step (and those after it) on a new input. An unchanged
// input resubmits as it is; a changed one must be JSON, checked before
// anything is sent.
function resubmitStepAction(task, step, describedBy) {
  let input = null;
  const shown = JSON.stringify(task.input, null, 2);
  const extra = () => {
    input = h('textarea', { class: 'signal-data', rows: 6, spellcheck: 'false', 'aria-label': `Input of task ${task.id} (JSON)` });
    input.value = shown;
    return h('label', { class: 'signal' }, 'The task\'s input (JSON); change it to run the step on a new input:', input);
  };
  const path = `/v1/tasks/${encodeURIComponent(task.id)}/steps/${encodeURIComponent(step.name)}/resubmit`;
  const resubmit = () => {
    if (input.value === shown) return api(path, { method: 'POST' });
    let parsed;
    try {
      parsed = JSON.parse(input.value);
    } catch (error) {
      return Promise.reject(new ApiError(`resubmit step ${step.name}: the input is not valid JSON (${error.message}); nothing was sent`));
    }
    return api(path, { method: 'POST', body: { input: parsed } });
  };
  return action('Resubmit step', `Resubmit step ${step.name} of task ${task.id}? It runs again, with the steps after it.`, resubmit,
    () => input.value === shown ? `Step ${step.name} resubmitted.` : `Step ${step.name} resubmitted with a new input.`, { describedBy, extra, reason: false });
}

function field(name, value) {
  return [h('dt', null, name), h('dd', null, value)];
}

function compact(value) {
  if (value === null || value === undefined) return '';
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return text === '{}' ? '' : text;
}

// The workflow's steps as a graph, left to right by dependency depth, each
// node coloured by the task's step state.
function dag(steps, stepStates, instances = new Map()) {
  const stateOf = new Map((stepStates ?? []).map((step) => [step.name, step.state]));
  const childOf = new Map((stepStates ?? []).filter((step) => step.workflow).map((step) => [step.name, step.workflow]));
  // A for_each step's node counts its instances that completed.
  const progress = (name) => {
    const group = instances.get(name);
    return group ? ` · ${group.list.filter((instance) => instance.state === 'completed').length}/${group.items}` : '';
  };
  const depth = new Map();
  const depthOf = (name, seen = new Set()) => {
    if (depth.has(name)) return depth.get(name);
    if (seen.has(name)) return 0;
    seen.add(name);
    const step = steps.find((candidate) => candidate.name === name);
    const d = step && step.depends_on.length ? 1 + Math.max(...step.depends_on.map((dep) => depthOf(dep, seen))) : 0;
    depth.set(name, d);
    return d;
  };
  steps.forEach((step) => depthOf(step.name));
  const columns = [];
  for (const step of steps) (columns[depth.get(step.name)] ??= []).push(step);
  const nodeWidth = 150, nodeHeight = 44, gapX = 60, gapY = 22;
  const position = new Map();
  columns.forEach((column, x) => column.forEach((step, y) => position.set(step.name, { x: 10 + x * (nodeWidth + gapX), y: 10 + y * (nodeHeight + gapY) })));
  const width = 20 + columns.length * (nodeWidth + gapX) - gapX;
  const height = 20 + Math.max(1, ...columns.map((c) => c.length)) * (nodeHeight + gapY) - gapY;
  const edges = steps.flatMap((step) => step.depends_on.map((dep) => {
    const from = position.get(dep), to = position.get(step.name);
    if (!from || !to) return null;
    const x1 = from.x + nodeWidth, y1 = from.y + nodeHeight / 2, x2 = to.x, y2 = to.y + nodeHeight / 2;
    return s('path', { d: `M${x1},${y1} C${x1 + gapX / 2},${y1} ${x2 - gapX / 2},${y2} ${x2 - 6},${y2}`, class: 'edge', 'marker-end': 'url(#arrow)' });
  }));
  const nodes = steps.map((step) => {
    const { x, y } = position.get(step.name);
    const state = stateOf.get(step.name) ?? 'not-run';
    return s('g', { class: 'step-node', 'data-step': step.name, 'data-state': state, transform: `translate(${x},${y})` },
      s('title', null, `${step.name}: ${state}${progress(step.name)}${step.agent ? ` (agent ${step.agent})` : ''}${step.waits_for ? ` (waits for ${step.waits_for})` : ''}`
        + `${childOf.has(step.name) ? ` (workflow ${childOf.get(step.name)})` : ''}${step.when ? ` (when: ${step.when})` : ''}`),
      s('rect', { width: nodeWidth, height: nodeHeight, rx: 8, class: `node state-${state}` }),
      s('text', { x: 10, y: 18, class: 'node-name' }, step.name.length > 18 ? `${step.name.slice(0, 17)}…` : step.name),
      s('text', { x: 10, y: 35, class: 'node-state' }, `${state}${progress(step.name)}`));
  });
  return s('svg', { class: 'dag', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img',
    'aria-label': `Workflow steps: ${steps.map((step) => `${step.name} ${stateOf.get(step.name) ?? 'not run'}`).join(', ')}` },
  s('defs', null, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
    s('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrow' }))),
  edges, nodes);
}

// Every attempt of every step from the history: when it was sent, how it
// ended, drawn on one time axis with the step's and the task's complete-by.
function attempts(task, history) {
  const byAttempt = new Map();
  const outcome = { step_completed: 'replied', step_failed: 'failed', expired: 'timed out', step_compensated: 'compensated', call_stopped: 'stopped' };
  for (const event of history) {
    if (!event.step) continue;
    const key = `${event.step}#${event.attempt ?? 0}`;
    if (event.kind === 'step_started') {
      byAttempt.set(key, { step: event.step, attempt: event.attempt, sent: event.at, end: null, outcome: 'in flight', detail: '' });
    } else if (outcome[event.kind]) {
      const entry = byAttempt.get(key) ?? { step: event.step, attempt: event.attempt, sent: null, end: null, outcome: '', detail: '' };
      entry.end = event.at;
      entry.outcome = outcome[event.kind];
      if (event.kind === 'step_failed') {
        // A timeout is a failure whose attempt outlived its complete-by.
        if (event.detail?.timed_out) entry.outcome = 'timed out';
        if (event.detail?.in_doubt) entry.outcome = 'in doubt, to be compensated';
        if (event.detail?.retry_in_ms !== null && event.detail?.retry_in_ms !== undefined) entry.outcome += ', retried';
      }
      entry.detail = compact(event.detail?.error ?? event.detail?.reason ?? '');
      byAttempt.set(key, entry);
    }
  }
  const rows = [...byAttempt.values()];
  if (rows.length === 0) return h('p', { class: 'empty' }, 'No attempt yet.');
  const now = Date.now();
  const times = rows.flatMap((row) => [row.sent, row.end]).filter((t) => t !== null);
  const stepDeadlines = task.steps.map((step) => step.complete_by).filter((t) => t !== null && t !== undefined);
  const start = Math.min(...times);
  const finish = Math.max(...times, ...(task.complete_by ? [task.complete_by] : []), ...stepDeadlines, rows.some((row) => row.end === null) ? now : 0);
  const span = Math.max(1, finish - start);
  const width = 640, label = 150, rowHeight = 22;
  const x = (t) => label + ((t - start) / span) * (width - label - 10);
  const height = rows.length * rowHeight + 24;
  const marks = [
    s('text', { x: label, y: height - 2, class: 'axis-label' }, clockText(start)),
    s('text', { x: width - 10, y: height - 2, class: 'axis-label', 'text-anchor': 'end' }, `+${duration(span)}`),
  ];
  if (task.complete_by) marks.push(s('g', { class: 'deadline task-deadline' },
    s('line', { x1: x(task.complete_by), y1: 0, x2: x(task.complete_by), y2: height - 14 }),
    s('text', { x: x(task.complete_by) - 4, y: height - 2, 'text-anchor': 'end' }, 'task complete-by')));
  const bars = rows.map((row, i) => {
    const y = i * rowHeight + 4;
    const from = row.sent ?? row.end, to = row.end ?? now;
    const step = task.steps.find((candidate) => candidate.name === row.step);
    const deadline = step && step.attempt === row.attempt && step.complete_by ? s('line', { x1: x(step.complete_by), y1: y, x2: x(step.complete_by), y2: y + rowHeight - 6, class: 'deadline step-deadline' },
      s('title', null, `step complete-by ${new Date(step.complete_by).toISOString()}`)) : null;
    return s('g', null,
      s('text', { x: 0, y: y + 13, class: 'attempt-label' }, `${row.step} #${row.attempt ?? '—'}`),
      s('rect', { x: x(from), y, width: Math.max(3, x(to) - x(from)), height: rowHeight - 6, rx: 3, class: `attempt outcome-${row.outcome.split(',')[0].replace(' ', '-')}` },
        s('title', null, `${row.step} attempt ${row.attempt}: ${row.outcome}`)),
      deadline);
  });
  return h('div', null,
    s('svg', { class: 'timeline', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': 'Attempts on a time axis' }, bars, marks),
    h('ol', { class: 'attempts' }, rows.map((row) => h('li', null,
      h('strong', null, `${row.step} attempt ${row.attempt ?? '—'}`), ': ',
      row.sent === null ? '' : ['sent at ', clock(row.sent), ', '], row.outcome,
      row.end === null ? '' : row.sent === null ? [' at ', clock(row.end)] : ` after ${duration(row.end - row.sent)}`,
      row.detail ? h('span', { class: 'error-text' }, ` — ${row.detail}`) : null))));
}

function alertsPage() {
  const body = h('div');
  return {
    title: 'Alerts', nav: '/ui/alerts', body,
    async update() {
      const alerts = await api('/v1/alerts?limit=200');
      body.replaceChildren(h('p', { class: 'hint' }, 'What the Supervisor raised for an operator to act on, newest first.'), alertsTable(alerts, 'No alerts.'));
    },
  };
}

function queuesPage() {
  const body = h('div');
  return {
    title: 'Queues', nav: '/ui/queues', polls: true, body,
    async update() {
      body.replaceChildren(queuesTable(await api('/v1/queues')));
    },
  };
}

function queuePage([name]) {
  const queue = decodeURIComponent(name);
  const path = `/v1/queues/${encodeURIComponent(queue)}`;
  const body = h('div');
  return {
    title: `Queue ${queue}`, nav: '/ui/queues', polls: true, body,
    async update() {
      const [stats, deadLetters] = await Promise.all([api(path), api(`${path}/dead-letters?limit=100`)]);
      body.replaceChildren(
        h('dl', { class: 'fields' }, field('Ready', number(stats.ready)), field('Leased', number(stats.leased)),
          field('Delayed', number(stats.delayed)), field('Dead-lettered', number(stats.dead_lettered)),
          field('Receives', stats.paused ? 'paused' : 'running'), field('Oldest ready', time(stats.oldest_ready_at))),
        h('div', { class: 'actions' },
          stats.paused
            ? action('Resume', `Resume receiving from ${queue}?`, (reason) => api(`${path}/resume`, { method: 'POST', body: { reason } }), () => `${queue} resumed.`)
            : action('Pause', `Pause receiving from ${queue}? Messages stay queued until it is resumed.`, (reason) => api(`${path}/pause`, { method: 'POST', body: { reason } }), () => `${queue} paused.`)),
        section('Dead letters',
          deadLetters.length === 0 ? null : h('div', { class: 'actions' },
            action('Redrive all', `Send every dead letter of ${queue} back to the queue?`, (reason) => api(`${path}/dead-letters/redrive`, { method: 'POST', body: { reason } }),
              (result) => `${number(result?.count ?? 0)} redriven.`),
            action('Purge', `Delete every dead letter of ${queue}? This cannot be undone.`, (reason) => api(`${path}/dead-letters/purge`, { method: 'POST', body: { reason } }),
              (result) => `${number(result?.count ?? 0)} purged.`)),
          table('Dead letters', ['Id', 'Reason', 'Deliveries', 'Dead-lettered', 'Body', ''], deadLetters.map((letter, i) => h('tr', null,
            h('th', { scope: 'row', id: `letter-${i}` }, letter.id), h('td', { class: 'error-text' }, letter.reason), h('td', { class: 'n' }, letter.delivery_count),
            h('td', null, time(letter.dead_lettered_at)), h('td', null, json(letter.body)),
            h('td', null, action('Redrive', `Send dead letter ${letter.id} back to ${queue}?`,
              (reason) => api(`${path}/dead-letters/${encodeURIComponent(letter.id)}/redrive`, { method: 'POST', body: { reason } }), () => `${letter.id} redriven.`, { describedBy: `letter-${i}` })))),
          'No dead letters.')));
    },
  };
}

function workflowsPage() {
  const body = h('div');
  return {
    title: 'Workflows', nav: '/ui/workflows', body,
    async update() {
      const workflows = await api('/v1/workflows');
      body.replaceChildren(table('Workflows', ['Workflow', 'Latest version', 'Steps', 'Registered', 'State', ''], workflows.map((workflow, i) => h('tr', null,
        h('th', { scope: 'row', id: `workflow-${i}` }, h('a', { href: `/ui/workflows/${encodeURIComponent(workflow.name)}` }, workflow.name)),
        h('td', { class: 'n' }, workflow.version),
        h('td', null, workflow.steps.map((step) => step.name).join(' → ')), h('td', null, time(workflow.registered_at)),
        h('td', null, workflow.paused ? workflowPausedNote(workflow) : 'running'),
        h('td', { class: 'actions' }, workflowPauseAction(workflow, `workflow-${i}`)))), 'No workflow is registered.'));
    },
  };
}

function workflowPage([name], query) {
  const workflow = decodeURIComponent(name);
  const body = h('div');
  return {
    title: `Workflow ${workflow}`, nav: '/ui/workflows', body,
    async update() {
      const latest = await api(`/v1/workflows/${encodeURIComponent(workflow)}`);
      const version = Number(query.get('version') ?? latest.version);
      const shown = version === latest.version ? latest : await api(`/v1/workflows/${encodeURIComponent(workflow)}/versions/${version}`);
      const versions = Array.from({ length: latest.version }, (_, i) => latest.version - i);
      const picker = h('form', { method: 'get', class: 'filters' }, h('label', { for: 'version' }, 'Version'),
        h('select', { id: 'version', name: 'version', onchange: (event) => event.target.form.requestSubmit() },
          versions.map((v) => h('option', { value: v, selected: v === version }, `${v}${v === latest.version ? ' (latest)' : ''}`))));
      body.replaceChildren(picker,
        h('p', { class: 'subtitle' }, workflowPausedNote(latest), latest.paused ? ' ' : null, 'registered ', time(shown.registered_at), ' · ',
          h('a', { href: `/ui/tasks${q({ workflow })}` }, 'its tasks'),
          latest.paused && latest.pause?.reason ? ` · paused by ${latest.pause.by}: ${latest.pause.reason}` : null),
        h('div', { class: 'actions' }, workflowPauseAction(latest, null)),
        section('Steps', dag(shown.steps, null),
          table('Steps', ['Step', 'Agent', 'After', 'When', 'Compensated'], shown.steps.map((step) => h('tr', null,
            h('td', null, step.name), h('td', null, stepDoer({ ...step, workflow: childWorkflowOf(shown.definition, step.name) })), h('td', null, step.depends_on.join(', ') || '—'),
            h('td', null, step.when ? h('code', null, step.when) : '—'), h('td', null, step.compensated ? 'yes' : 'no'))))),
        section('Definition', json(shown.definition)));
    },
  };
}

// The child workflow a `workflow:` step runs, from the definition as registered
// (the summary of its steps does not name it).
function childWorkflowOf(definition, name) {
  const step = (definition?.steps ?? []).find((candidate) => candidate.name === name);
  return typeof step?.workflow === 'string' ? step.workflow : null;
}

// The schedules, with their next fire; pause or resume and fire now.
function schedulesPage() {
  const body = h('div');
  return {
    title: 'Schedules', nav: '/ui/schedules', polls: true, body,
    async update() {
      const schedules = await api('/v1/schedules');
      body.replaceChildren(table('Schedules', ['Schedule', 'Workflow', 'Cron', 'Time zone', 'State', 'Next fire', 'Last task', 'Skipped', ''],
        schedules.map((schedule, i) => {
          const path = `/v1/schedules/${encodeURIComponent(schedule.name)}`;
          const name = schedule.name;
          return h('tr', null,
            h('th', { scope: 'row', id: `schedule-${i}` }, name),
            h('td', null, h('a', { href: `/ui/workflows/${encodeURIComponent(schedule.workflow)}` }, schedule.workflow)),
            h('td', null, h('code', null, schedule.cron)), h('td', null, schedule.timezone),
            h('td', null, schedule.paused ? 'paused' : 'running'),
            h('td', null, schedule.paused ? '—' : time(schedule.next_fire_at)),
            h('td', null, schedule.last_task ? taskLink(schedule.last_task) : '—'),
            h('td', { class: 'n' }, number(schedule.skipped)),
            h('td', { class: 'actions' },
              schedule.paused
                ? action('Resume', `Resume schedule ${name}? It fires from now on; fires while it was paused are not caught up.`,
                  (reason) => api(`${path}/resume`, { method: 'POST', body: { reason } }), () => `${name} resumed.`, { describedBy: `schedule-${i}` })
                : action('Pause', `Pause schedule ${name}? It does not fire until resumed.`,
                  (reason) => api(`${path}/pause`, { method: 'POST', body: { reason } }), () => `${name} paused.`, { describedBy: `schedule-${i}` }),
              action('Fire now', `Fire schedule ${name} now? It starts ${schedule.workflow} with the schedule's input.`,
                (reason) => api(`${path}/trigger`, { method: 'POST', body: { reason } }), (task) => `${name} fired: task ${task?.id ?? ''}.`, { describedBy: `schedule-${i}` })));
        }), 'No schedules. `rota schedules create` makes one; a workflow file may declare them under `schedules:`.'));
    },
  };
}

// ---------------------------------------------------------------------------
// Drawing and live updates.

async function redraw() {
  if (!current) return;
  try {
    await current.update();
    document.getElementById('problem').textContent = '';
  } catch (error) {
    if (!(error instanceof ApiError && error.message === 'signed out')) problem(error.message);
  }
}

let redrawTimer = null;
let redrawWanted = false;

function scheduleRedraw() {
  if (redrawTimer !== null) return;
  redrawTimer = setTimeout(async () => {
    redrawTimer = null;
    // Never redraw under an open confirmation: it would take its button away.
    if (dialogOpen) { redrawWanted = true; return; }
    await redraw();
  }, REDRAW_DELAY_MS);
}

let source = null;

// Follows the page's event stream. A task's stream ends when the task does
// (event `end`); it is followed again after an action that may revive it.
function follow(stream) {
  const live = document.getElementById('live');
  if (source && source.readyState !== EventSource.CLOSED) return;
  source = new EventSource(stream);
  source.onopen = () => { live.textContent = 'live'; live.classList.add('on'); };
  source.onerror = () => { live.textContent = 'reconnecting'; live.classList.remove('on'); };
  source.onmessage = () => scheduleRedraw();
  source.addEventListener('end', () => {
    source.close();
    live.textContent = 'ended';
    live.classList.remove('on');
    scheduleRedraw();
  });
}

function stream() {
  return current.stream ?? `/v1/events${q({ after: EVENTS_AFTER })}`;
}

async function start() {
  const path = location.pathname;
  const query = new URLSearchParams(location.search);
  const main = document.getElementById('main');
  for (const [pattern, page] of pages) {
    const match = pattern.exec(path);
    if (!match) continue;
    current = page(match.slice(1), query);
    document.title = `${current.title} · rota`;
    for (const link of document.querySelectorAll('nav[aria-label="Main"] a')) {
      if (link.getAttribute('href') === current.nav) link.setAttribute('aria-current', 'page');
    }
    main.replaceChildren(h('h1', null, current.title), current.body);
    await redraw();
    follow(stream());
    // A page may start or stop polling as it redraws (the batches page
    // polls only while one runs).
    setInterval(() => { if (current.polls && !dialogOpen) scheduleRedraw(); }, POLL_MS);
    setInterval(() => { if (redrawWanted && !dialogOpen) { redrawWanted = false; scheduleRedraw(); } }, 1000);
    return;
  }
  main.replaceChildren(h('h1', null, 'Not found'), h('p', null, 'No dashboard page has this address. ', h('a', { href: '/ui' }, 'Overview')));
}

start();
