// @ag-ui/client's HttpAgent on a run whose worker dies mid-answer, then the run's rest read the ways
// docs/frontends.md tells an AG-UI client to: by the X-Run-Id of the /agui response, through the run routes.
// node agui-lost.mjs <url of /agui> <RunAgentInput messages as JSON> [--poll]
//   ->  a line "event {json}" as each AG-UI event comes (the test kills the worker on one), then one JSON line:
//       the AG-UI run's error, events and messages, the run id, unhandled rejections, and "followed": the run's
//       frames ({event, data}) from /v1/runs/<id>/events, start to terminal frame; or with --poll, "polled": its
//       status (GET /v1/runs/<id>) once it is no longer running.
import { HttpAgent } from '@ag-ui/client';

const [url, messagesJson, how] = process.argv.slice(2);
const unhandled = [];
// @ag-ui/client 1.0.0 rethrows a broken body's error when it cancels the body's reader: a rejection nobody
// handles, which ends a Node process by default.  Noted, so the test can say what a client must expect.
process.on('unhandledRejection', (reason) => { unhandled.push(String(reason?.message ?? reason)); });

let runId = null;
const agent = new HttpAgent({
  url, threadId: 'thread-1', initialMessages: JSON.parse(messagesJson),
  fetch: async (input, init) => {  // HttpAgent's own hook: the response's X-Run-Id names the run in the log
    const response = await fetch(input, init);
    runId = response.headers.get('X-Run-Id');
    return response;
  },
});

const events = [];
let error = null;
try {
  await agent.runAgent({ runId: 'run-1' }, {
    onEvent: ({ event }) => { events.push(event); process.stdout.write(`event ${JSON.stringify(event)}\n`); },
  });
} catch (caught) {
  error = String(caught?.message ?? caught);
}

async function follow(eventsUrl) {  // the run's frames, resumed (a dead worker's connection fails: try again)
  const frames = [];
  for (let attempt = 0; attempt < 30; attempt += 1) {
    try {
      const response = await fetch(eventsUrl, { headers: { Accept: 'text/event-stream' } });
      if (response.status !== 200) { throw new Error(`HTTP ${response.status}`); }
      const text = await response.text();
      for (const block of text.split('\n\n')) {
        const event = /^event: (.*)$/m.exec(block)?.[1] ?? 'message';
        const data = /^data: (.*)$/m.exec(block)?.[1];
        if (data !== undefined && data !== '[DONE]') { frames.push({ event, data: JSON.parse(data) }); }
      }
      return frames;
    } catch (caught) {
      await new Promise((resolve) => { setTimeout(resolve, 500); });
    }
  }
  throw new Error('the run could not be followed');
}

async function poll(statusUrl) {  // the run's status until it ended (each poll may take a lost run over)
  for (let attempt = 0; attempt < 120; attempt += 1) {
    try {
      const response = await fetch(statusUrl);
      const status = response.status === 200 ? await response.json() : null;
      if (status && status.state !== 'running') { return status; }
    } catch (caught) { /* the dead worker's connection: try again */ }
    await new Promise((resolve) => { setTimeout(resolve, 250); });
  }
  throw new Error('the run did not end');
}

const runUrl = new URL(`/v1/runs/${runId}`, url).href;
const followed = error && runId && how !== '--poll' ? await follow(`${runUrl}/events`) : null;
const polled = error && runId && how === '--poll' ? await poll(runUrl) : null;
await new Promise((resolve) => { setTimeout(resolve, 100); });  // let a late rejection be noted
process.stdout.write(JSON.stringify({ error, events, messages: agent.messages, runId, unhandled, followed, polled }) + '\n');
