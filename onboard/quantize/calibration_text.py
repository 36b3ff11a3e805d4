"""The bundled calibration text for NVFP4 activation scales (nothing is downloaded).

Mixed registers (prose, dialogue, code, numbers, lists, technical writing), so that
the activations seen during calibration are not those of one kind of text only.
Written for this project; it is kept apart from the accuracy check's prompts.
"""

TEXT = """\
The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the
one hundred and twelve steps out of habit rather than need. From the lantern room he
could see the whole bay: the fishing boats returning with their nets folded, the
ferry leaving for the island, and the long grey line of the breakwater where the
gulls gathered before a storm.

"Do you ever get tired of it?" his niece asked when she visited in the summer.
"Of the sea?" he said. "No. It is never the same twice. Yesterday it was green and
quiet; tonight the wind is from the north and it will be loud until morning."

def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    out = []
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out

Quarterly results, in millions: revenue 412.7 (up 8.3 percent), operating costs
298.1, research 61.4, net income 39.9. Headcount rose from 2,340 to 2,518. The board
approved a dividend of 0.42 per share, payable on 15 March to holders of record on
1 March.

Shopping list: rice, lentils, two onions, garlic, fresh ginger, a tin of tomatoes,
coriander, lemons, yoghurt, flatbread, olive oil, black pepper, cumin seeds.

To replace a bicycle inner tube, first release the brake and remove the wheel. Let
out any remaining air, push the valve up into the tyre, and lever one side of the
tyre off the rim, working around the wheel. Pull out the old tube, check the inside
of the tyre for thorns or glass, then fit the new tube, slightly inflated, starting
at the valve. Ease the tyre back onto the rim with your thumbs and inflate it to the
pressure printed on the sidewall.

SELECT region, COUNT(*) AS orders, SUM(amount) AS revenue
FROM sales
WHERE order_date >= DATE '2024-01-01'
GROUP BY region
ORDER BY revenue DESC
LIMIT 10;

In thermodynamics, entropy measures the number of microscopic configurations that
are consistent with a macroscopic state. An isolated system evolves towards states of
higher entropy, which is why heat flows from a hot body to a cold one and not the
other way round. The second law does not forbid local decreases of entropy; it only
requires that they be paid for by larger increases elsewhere.

Q: How many minutes are there in a week?
A: Seven days times twenty-four hours times sixty minutes, which is 10,080 minutes.

The committee met on Tuesday. Present: the chair, the treasurer, four members and
one observer. Minutes of the previous meeting were approved without changes. The
treasurer reported that the roof repair came in under budget. A proposal to extend
the library's opening hours on Saturdays was discussed at length and deferred until
the staff survey is complete.

for (let i = 0; i < items.length; i++) {
  const item = items[i];
  if (!item.visible) continue;
  render(item, { x: item.x * scale, y: item.y * scale });
}

Mountains shape the weather around them. Moist air forced up a slope cools and drops
its rain on the windward side, leaving the far side dry; this is why a green valley
and a desert can lie within a day's walk of each other. Farmers on both sides learned
long ago which crops each side would bear.

Prime numbers below one hundred: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43,
47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97. There are twenty-five of them.

Dear Ms. Okafor, thank you for your letter of the 4th. I am glad to confirm that the
workshop will take place as planned, in room 3B, from nine until half past four. Lunch
will be provided; please let us know of any dietary requirements by Friday.

The train was late again, so she read the whole chapter on the platform: how the old
city walls were torn down to make room for the ring road, how the market moved twice,
and how the river, once lined with mills, became a park where children now race paper
boats under the bridges.
"""
