// @ag-ui/client's HttpAgent on a run whose worker dies mid-answer, then the run's rest read the way
// docs/frontends.md tells an AG-UI client to: by the X-Run-Id of the /agui response, from /v1/runs/<id>/events.
// node agui-lost.mjs <url of /agui> <RunAgentInput messages as JSON>
//   ->  a line "event {json}" as each AG-UI event comes (the test kills the worker on one), then one JSON line: the AG-UI run's error, events and messages, the run id, unhandled rejections, and
//       "followed": the run's frames after the break ({event, data}), up to its terminal frame.
import { HttpAgent } from '@ag-ui/client';

const [url, messagesJson] = process.argv.slice(2);
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

const followed = error && runId ? await follow(new URL(`/v1/runs/${runId}/events`, url).href) : null;
await new Promise((resolve) => { setTimeout(resolve, 100); });  // let a late rejection be noted
process.stdout.write(JSON.stringify({ error, events, messages: agent.messages, runId, unhandled, followed }) + '\n');
